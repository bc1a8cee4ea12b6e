//! Port-forwards to a tenant control-plane pod that the local runtime runs reach that tenant's
//! API server. kwok serves pods/portforward for the simulated node; by default it sends every
//! forward to one loopback port a test listens on (the ClusterPortForward of
//! `testenv/kwok/debugging/pods.yaml`). For a control-plane pod, the local runtime publishes a
//! kwok `PortForward` named after the pod that sends the pod's API port (6443, which the runtime
//! names) to the loopback port its API server listens on, so `tenantplane connect` and `kubectl
//! port-forward` reach the real tenant. The pod owns it, so it goes when the pod goes; a new pod of
//! the same name takes it over. This module knows kwok's kind; the local runtime
//! (`tenantplane-local`) decides what to forward.

use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::{Error, Result};

/// Our CustomResourceDefinition of kwok's PortForward kind.
const CRD_YAML: &str = include_str!("../../../testenv/kwok/crds/portforward.yaml");
const CRD_NAME: &str = "portforwards.kwok.x-k8s.io";

/// The field manager of the PortForwards the local runtime writes.
pub const FIELD_MANAGER: &str = "tenantplane-local-runtime";

/// kwok's PortForward, `kwok.x-k8s.io/v1alpha1`.
pub fn resource() -> ApiResource {
    ApiResource {
        group: "kwok.x-k8s.io".into(),
        version: "v1alpha1".into(),
        api_version: "kwok.x-k8s.io/v1alpha1".into(),
        kind: "PortForward".into(),
        plural: "portforwards".into(),
    }
}

/// Install the PortForward CRD with `kubectl` (the control plane's, given its arguments) and wait
/// until it is served; kwok must find it when it starts watching. `dir` takes the manifest.
pub(crate) fn install_crd(dir: &Path, kubectl: impl Fn(&[&str]) -> Result<()>) -> Result<()> {
    let path = dir.join("portforward-crd.yaml");
    std::fs::write(&path, CRD_YAML)
        .map_err(|e| Error::Io(format!("writing {}: {e}", path.display())))?;
    kubectl(&["apply", "-f", &path.display().to_string()])?;
    crate::host_cluster::wait_established(&kubectl, &[&format!("crd/{CRD_NAME}")])
}

/// The PortForward of `pod`: its port `pod_port` goes to `127.0.0.1:<loopback_port>`.
pub fn desired(pod: &Pod, pod_port: i32, loopback_port: u16) -> Result<serde_json::Value> {
    let uid = pod
        .uid()
        .ok_or_else(|| Error::Io(format!("pod {} has no UID yet", pod.name_any())))?;
    Ok(json!({
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "PortForward",
        "metadata": {
            "name": pod.name_any(),
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.name_any(),
                "uid": uid,
            }],
        },
        "spec": {"forwards": [{
            "ports": [pod_port],
            "target": {"address": "127.0.0.1", "port": loopback_port},
        }]},
    }))
}

/// Server-side apply the PortForward of `pod` (in its namespace) from its port `pod_port` to
/// `loopback_port`.
pub async fn publish(client: &Client, pod: &Pod, pod_port: i32, loopback_port: u16) -> Result<()> {
    let ns = pod.namespace().unwrap_or_default();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource());
    let body = desired(pod, pod_port, loopback_port)?;
    api.patch(
        &pod.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(body),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forward_names_the_pod_its_owner_and_the_port() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "dev-0", "namespace": "team", "uid": "u-1"},
        }))
        .unwrap();
        let pf = desired(&pod, 6443, 24567).unwrap();
        assert_eq!(pf["metadata"]["name"], "dev-0");
        assert_eq!(pf["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(pf["spec"]["forwards"][0]["ports"], json!([6443]));
        assert_eq!(
            pf["spec"]["forwards"][0]["target"],
            json!({"address": "127.0.0.1", "port": 24567})
        );
        let crd: serde_json::Value = serde_yaml::from_str(CRD_YAML).unwrap();
        assert_eq!(crd["metadata"]["name"], CRD_NAME);
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        let unowned: Pod = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
        assert!(desired(&unowned, 6443, 1).is_err());
    }
}
