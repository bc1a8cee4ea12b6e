//! A real Kubernetes control plane for tests and the local dev cluster: etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler and kwok (one simulated node that drives pods to
//! Running), built from their Go modules by `testenv/build.sh`. No mocks.
//!
//! Tests share one control plane per test binary ([`shared`]) and take a fresh namespace each
//! ([`namespace`]); when a test fails, the components' logs are printed.
//!
//! It knows nothing of the operator: what must match the operator's names (the simulated node's
//! taint, the agent's image) its caller passes in. The local runtime, which stands in for the
//! kubelet the operator's pods need, is `tenantplane-local`, on top of this crate.

pub mod apiserver;
pub mod binaries;
pub mod cases;
pub mod conformance;
pub mod dns;
mod error;
pub mod host_cluster;
pub mod kubeconfig;
pub mod local_forward;
pub mod metrics;
pub mod netns;
pub mod operator;
pub mod process;
pub mod s3;
mod shared;

pub use binaries::{Agent, Binaries};
pub use error::{Error, Result};
pub use host_cluster::{ControlPlane, Nodes, Options};
pub use shared::{
    TestNamespace, eventually, install_crds_and_policies, kubectl, namespace, real_node_room,
    repo_path, serve_agent_from, shared, use_real_nodes, wait_for_crds,
};
