//! The local runtime, for the tests and `tenantplane dev` only: on the test control plane of
//! `tenantplane-testenv`, it stands in for the kubelet and the k3s image of a tenant's
//! control-plane pod ([`runtime`]) and for its CoreDNS pod (`dns.rs`), and reaches a tenant as
//! the operator does ([`tenant`]). [`metrics`] reads the operator's figures for the benchmarks.
//!
//! It is the one crate of the test world that knows the operator and the syncer: the pods it runs
//! are theirs, and it reads their names, labels and annotations. `tenantplane-testenv` below it
//! knows neither, so the binary's `dev` feature links only what the dev cluster needs.

mod dns;
mod error;
pub mod metrics;
mod probes;
pub mod runtime;
pub mod tenant;

pub use error::{Error, Result};
pub use runtime::LocalRuntime;
