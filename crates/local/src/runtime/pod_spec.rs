//! What the local runtime reads of a control-plane pod's spec: its containers' arguments and Go
//! runtime variables, its init containers' variables, and the files it mounts from ConfigMaps.

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::{Client, ResourceExt};

use tenantplane_testenv::{Error, Result};

/// The value of variable `name` of the pod's init containers.
pub(super) fn init_env(pod: &Pod, name: &str) -> Option<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

/// The Go runtime's variables (`GOGC`, `GOMEMLIMIT`) of the pod's container, which k3s's one
/// process would run under: each of the stand-in's processes runs under them.
pub(super) fn go_runtime_env(pod: &Pod) -> Vec<(String, String)> {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.env.iter().flatten())
        .filter(|e| e.name.starts_with("GO"))
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect()
}

/// The file at `path` in pod `pod`, where a container mounts a ConfigMap (read from the host):
/// as a kubelet projects it.
pub(super) async fn mounted_config_map_file(
    client: &Client,
    pod: &Pod,
    path: &str,
) -> Result<String> {
    let ns = pod.namespace().unwrap_or_default();
    let spec = pod.spec.as_ref();
    let (volume, key) = spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .find_map(|m| {
            let key = path.strip_prefix(&format!("{}/", m.mount_path))?;
            Some((m.name.clone(), key.to_string()))
        })
        .ok_or_else(|| {
            Error::Io(format!(
                "pod {ns}/{} mounts nothing at {path}",
                pod.name_any()
            ))
        })?;
    let config_map = spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .find(|v| v.name == volume)
        .and_then(|v| v.config_map.as_ref())
        .map(|c| c.name.clone())
        .ok_or_else(|| {
            Error::Io(format!(
                "volume {volume} of pod {ns}/{} is not a ConfigMap",
                pod.name_any()
            ))
        })?;
    let found = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &ns)
        .get(&config_map)
        .await?;
    found
        .data
        .and_then(|mut d| d.remove(&key))
        .ok_or_else(|| Error::Io(format!("ConfigMap {ns}/{config_map} has no {key}")))
}

/// The values of the pod's container arguments that start with `prefix`.
pub(super) fn args_value<'a>(pod: &'a Pod, prefix: &str) -> Vec<&'a str> {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.args.iter().flatten())
        .filter_map(|a| a.strip_prefix(prefix))
        .collect()
}
