//! Endpoints go down only for selector-less Services, whose Endpoints a person wrote; the host
//! computes the rest from its own pods.

use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::ResourceExt;

use crate::copy::CopyDown;
use crate::copy_down_kind;
use crate::kind::Kind;
use crate::kinds::services::Services;
use crate::tenant::Tenant;
use crate::translate::Translator;

pub struct EndpointsKind;

copy_down_kind!(EndpointsKind, Endpoints, "Endpoints");

impl CopyDown for EndpointsKind {
    fn wanted(cx: &Tenant, ep: &Endpoints) -> bool {
        let (ns, name) = (ep.namespace().unwrap_or_default(), ep.name_any());
        let selectorless = cx.tenant_get::<Service>(&ns, &name).is_some_and(|s| {
            s.spec.as_ref().is_none_or(|sp| sp.selector.is_none())
                && cx.policy.to_host.services.enabled
                && cx.selected(Services::NAME, &s.metadata)
        });
        selectorless
            && cx.policy.to_host.endpoints.enabled
            && cx.selected(Self::NAME, &ep.metadata)
            && !(ns == "default" && name == "kubernetes")
    }

    fn translate(tr: &Translator, ep: &Endpoints) -> Endpoints {
        let mut subsets = ep.subsets.clone();
        for s in subsets.iter_mut().flatten() {
            for a in s
                .addresses
                .iter_mut()
                .flatten()
                .chain(s.not_ready_addresses.iter_mut().flatten())
            {
                // Tenant object references mean nothing on the host.
                a.target_ref = None;
                a.node_name = None;
            }
        }
        Endpoints {
            metadata: tr.host_meta(&ep.metadata),
            subsets,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::tests::translator;
    use serde_json::json;

    #[test]
    fn tenant_references_are_dropped_from_addresses() {
        let ep: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "default"},
            "subsets": [{"addresses": [{"ip": "10.1.2.3", "nodeName": "n",
                "targetRef": {"kind": "Pod", "name": "db-0"}}], "ports": [{"port": 5432}]}]
        }))
        .unwrap();
        let host = EndpointsKind::translate(&translator(), &ep);
        let a = &host.subsets.unwrap()[0].addresses.clone().unwrap()[0];
        assert_eq!(a.ip, "10.1.2.3");
        assert!(a.target_ref.is_none() && a.node_name.is_none());
    }
}
