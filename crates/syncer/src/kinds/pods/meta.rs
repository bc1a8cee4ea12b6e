//! The metadata of a tenant pod's host copy: the syncer's marks, and what the copy's pod needs
//! to know of its tenant (the service account it runs as, the node address its kubelet serves,
//! the tenant generation it was made from).

use k8s_openapi::api::core::v1::Pod;

use crate::naming;
use crate::translate::Translator;

/// The host metadata of a tenant pod's copy, named `host_name`: the marks, and the service
/// account it runs as.
pub fn pod_meta(tr: &Translator, pod: &Pod, host_name: &str) -> kube::api::ObjectMeta {
    let mut meta = tr.host_meta("Pod", &pod.metadata, host_name);
    let spec = pod.spec.as_ref();
    let sa = spec
        .and_then(|s| s.service_account_name.clone().or(s.service_account.clone()))
        .unwrap_or_else(|| "default".into());
    if let Some(a) = meta.annotations.as_mut() {
        a.insert(naming::ANNOTATION_SERVICE_ACCOUNT.into(), sa);
        let host_ip = tr.kubelet.as_ref().map(|k| k.address.clone());
        a.insert(
            naming::ANNOTATION_HOST_IP.into(),
            host_ip.unwrap_or_default(),
        );
        if let Some(generation) = pod.metadata.generation {
            a.insert(
                naming::ANNOTATION_TENANT_GENERATION.into(),
                generation.to_string(),
            );
        }
    }
    meta
}
