//! A tenant's own RuntimeClasses on the host. A RuntimeClass is cluster-scoped, so a tenant's
//! never reaches the host; what it asks for is its `handler` (the container runtime's name for
//! a sandbox, such as `runsc` or `kata`). A tenant pod naming one runs on the host under a
//! RuntimeClass the IsolationProfile lists in `allow.runtimeClasses` with the same handler. A
//! pod naming a listed host class by its own name keeps it; any other is refused by the review.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::Api;

use crate::error::Result;
use crate::tenant::Tenant;

/// The pod as its host copy is to be made: with `runtimeClassName` naming the listed host class
/// whose handler is the tenant class's. Unchanged when it names no class, names a listed one, or
/// no listed class has that handler (the review then refuses it). A pod's class cannot change,
/// so once its `copy` exists under a listed class, that is the answer; the APIs are asked only
/// before, for a pod naming a tenant class while the profile lists some.
pub async fn for_host(cx: &Tenant, pod: Arc<Pod>, copy: Option<&Pod>) -> Result<Arc<Pod>> {
    let listed = &cx.tr.allow.runtime_classes;
    let class = |p: &Pod| p.spec.as_ref()?.runtime_class_name.clone();
    let Some(name) = class(&pod) else {
        return Ok(pod);
    };
    if listed.is_empty() || listed.contains(&name) {
        return Ok(pod);
    }
    let host_name = match copy.and_then(class).filter(|c| listed.contains(c)) {
        Some(settled) => settled,
        None => {
            let Some(tenant_class) = Api::<RuntimeClass>::all(cx.tenant.clone())
                .get_opt(&name)
                .await?
            else {
                return Ok(pod);
            };
            let hosts = Api::<RuntimeClass>::all(cx.host.clone());
            let mut host_classes = Vec::new();
            for class in listed {
                if let Some(c) = hosts.get_opt(class).await? {
                    host_classes.push(c);
                }
            }
            let Some(host_name) = same_handler(&tenant_class, &host_classes) else {
                return Ok(pod);
            };
            host_name
        }
    };
    let mut mapped = (*pod).clone();
    if let Some(spec) = mapped.spec.as_mut() {
        spec.runtime_class_name = Some(host_name);
    }
    Ok(Arc::new(mapped))
}

/// The first of `host_classes` (the listed ones the host has, in the profile's order) whose
/// handler is `tenant_class`'s.
pub fn same_handler(tenant_class: &RuntimeClass, host_classes: &[RuntimeClass]) -> Option<String> {
    host_classes
        .iter()
        .find(|h| h.handler == tenant_class.handler)
        .and_then(|h| h.metadata.name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn class(name: &str, handler: &str) -> RuntimeClass {
        RuntimeClass {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            handler: handler.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_tenant_class_runs_on_the_first_listed_host_class_with_its_handler() {
        let hosts = [
            class("kata", "kata"),
            class("sandboxed", "runsc"),
            class("gvisor", "runsc"),
        ];
        assert_eq!(
            same_handler(&class("my-gvisor", "runsc"), &hosts).as_deref(),
            Some("sandboxed")
        );
        assert_eq!(same_handler(&class("wasm", "spin"), &hosts), None);
        assert_eq!(same_handler(&class("my-gvisor", "runsc"), &[]), None);
    }
}
