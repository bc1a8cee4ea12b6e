//! EndpointSlices a person writes for a selector-less Service go down as written, filtered as
//! hand-written Endpoints are: the host's proxies route the Service's copy by them. Slices the
//! tenant's own controllers keep (computed from pods, or mirrored from hand-written Endpoints,
//! which go down themselves) stay in the tenant.

use std::collections::BTreeSet;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use kube::ResourceExt;

use super::{left_out, written_by_hand};
use crate::copy::CopyDown;
use crate::copy_down_kind;
use crate::key::Key;
use crate::kind_trait::Kind;
use crate::tell::Review;
use crate::tenant::Tenant;
use crate::translate::Translator;

/// The label that ties a slice to its Service, on both sides.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The label that names who keeps a slice, so each controller touches only its own.
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// Who keeps the host copies.
pub const MANAGED_BY_SYNCER: &str = "syncer.tenantplane.io";
/// The tenant controllers whose slices stay in the tenant: the host computes its own.
const TENANT_CONTROLLERS: [&str; 2] = [
    "endpointslice-controller.k8s.io",
    "endpointslicemirroring-controller.k8s.io",
];

/// EndpointSlices written by hand for selector-less Services, copied down.
pub struct EndpointSlices;

// One switch for what a person writes of a Service's endpoints, in either API.
copy_down_kind!(EndpointSlices, EndpointSlice, "EndpointSlice", to_host.endpoints as "endpoints";
    fn listed_as() -> String {
        "endpointslices".into()
    }
);

impl CopyDown for EndpointSlices {
    fn wanted(cx: &Tenant, s: &EndpointSlice) -> bool {
        let ns = s.namespace().unwrap_or_default();
        by_hand_for(s).is_some_and(|svc| written_by_hand(cx, &ns, svc))
            && Self::synced(cx, &s.metadata)
    }

    /// Without the tenant's caches no address is known to be its own: only the profile's CIDRs.
    fn translate(tr: &Translator, s: &EndpointSlice, host_name: &str) -> EndpointSlice {
        translate_with(tr, s, host_name, &BTreeSet::new()).0
    }

    fn translate_in(
        cx: &Tenant,
        s: &EndpointSlice,
        host_name: &str,
        _: Option<&EndpointSlice>,
    ) -> EndpointSlice {
        translate_with(&cx.tr, s, host_name, &cx.own_pod_ips()).0
    }

    fn review_in(cx: &Tenant, s: &EndpointSlice, _: Option<&EndpointSlice>) -> Review {
        let mut dropped = cx.tr.annotations(Self::NAME, &s.metadata).1;
        dropped.extend(translate_with(&cx.tr, s, "", &cx.own_pod_ips()).1);
        Review {
            refused: vec![],
            dropped,
        }
    }

    /// The address type of a slice cannot change.
    fn must_replace(desired: &EndpointSlice, live: &EndpointSlice) -> bool {
        desired.address_type != live.address_type
    }
}

/// The Service a person wrote slice `s` for, if a person wrote it (not one of the tenant's own
/// controllers).
fn by_hand_for(s: &EndpointSlice) -> Option<&str> {
    let labels = s.metadata.labels.as_ref()?;
    let managed_by = labels.get(LABEL_MANAGED_BY).map(String::as_str);
    if managed_by.is_some_and(|m| TENANT_CONTROLLERS.contains(&m)) {
        return None;
    }
    labels.get(LABEL_SERVICE_NAME).map(String::as_str)
}

/// Queue the slices whose going down follows tenant Service `ns/name` (its selector, sync or
/// life changed): while a person writes its endpoints, their slices for it, to go down; otherwise
/// the copies of its slices on the host, to go. Each Service's converge calls it, and the tenant
/// has a slice of its own controller's for nearly every Service: only selector-less ones look
/// through the tenant's slices.
pub fn wake_for_service(cx: &Tenant, ns: &str, name: &str) {
    if written_by_hand(cx, ns, name) {
        for s in cx.tenant_list::<EndpointSlice>() {
            if s.namespace().as_deref() == Some(ns) && by_hand_for(&s) == Some(name) {
                cx.queue.add(Key::for_object::<EndpointSlices>(&*s));
            }
        }
        return;
    }
    let service_copy = cx.tr.host_name(ns, name);
    for h in cx.host_slice::<EndpointSlice>() {
        if h.labels().get(LABEL_SERVICE_NAME) == Some(&service_copy) {
            for key in EndpointSlices::host_keys(&h, cx.tr.name()) {
                cx.queue.add(key);
            }
        }
    }
}

/// The slices of namespace `ns`, queued (see [`crate::kinds::endpoints::wake_namespace`]).
pub fn wake_namespace(cx: &Tenant, ns: &str) {
    for s in cx.tenant_list::<EndpointSlice>() {
        if s.namespace().as_deref() == Some(ns) {
            cx.queue.add(Key::for_object::<EndpointSlices>(&*s));
        }
    }
}

/// A pod copy came, changed or went: queue the slices whose copy no longer holds the addresses
/// it should, so an address leaves a copy with its pod (as [`crate::kinds::endpoints::wake_stale`]).
pub fn wake_stale(
    cx: &Tenant,
    own: &std::cell::LazyCell<BTreeSet<String>, impl FnOnce() -> BTreeSet<String>>,
) {
    for s in cx.tenant_list::<EndpointSlice>() {
        if !EndpointSlices::wanted(cx, &s) {
            continue;
        }
        let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
        let host_name = cx.tr.host_name(&ns, &name);
        let live = cx.host_copy::<EndpointSlice>(&host_name, &ns, &name);
        let should = translate_with(&cx.tr, &s, &host_name, own).0;
        if live.is_none_or(|live| live.endpoints != should.endpoints) {
            cx.queue.add(Key::of::<EndpointSlices>(ns, name));
        }
    }
}

/// The host copy of tenant slice `s`, named `host_name`: tied to its Service's copy and kept by
/// the syncer; only addresses of this tenant's own pods (`own`) or inside the profile's
/// `allow.endpointCIDRs` (an endpoint left with none goes); tenant object references, node
/// names and hints left out (they name tenant objects). And a sentence per address left out.
pub fn translate_with(
    tr: &Translator,
    s: &EndpointSlice,
    host_name: &str,
    own: &BTreeSet<String>,
) -> (EndpointSlice, Vec<String>) {
    let mut metadata = tr.host_meta(EndpointSlices::NAME, &s.metadata, host_name);
    let labels = metadata.labels.get_or_insert_default();
    if let Some(svc) = by_hand_for(s) {
        let ns = s.namespace().unwrap_or_default();
        labels.insert(LABEL_SERVICE_NAME.into(), tr.host_name(&ns, svc));
    }
    labels.insert(LABEL_MANAGED_BY.into(), MANAGED_BY_SYNCER.into());
    let mut dropped = Vec::new();
    let endpoints = s
        .endpoints
        .iter()
        .flatten()
        .filter_map(|e| {
            let addresses: Vec<String> = e
                .addresses
                .iter()
                .filter(|ip| match left_out(tr, own, ip) {
                    Some(why) => {
                        dropped.push(why);
                        false
                    }
                    None => true,
                })
                .cloned()
                .collect();
            (!addresses.is_empty()).then(|| Endpoint {
                addresses,
                conditions: e.conditions.clone(),
                hostname: e.hostname.clone(),
                zone: e.zone.clone(),
                deprecated_topology: None,
                hints: None,
                node_name: None,
                target_ref: None,
            })
        })
        .collect();
    let slice = EndpointSlice {
        metadata,
        address_type: s.address_type.clone(),
        endpoints: Some(endpoints),
        ports: s.ports.clone(),
    };
    (slice, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::tests::{host_name_of, translator};
    use serde_json::json;

    fn slice(v: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_slices_a_person_wrote_name_their_service() {
        let of = |labels: serde_json::Value| {
            slice(
                json!({"metadata": {"name": "s", "namespace": "default", "labels": labels},
                         "addressType": "IPv4", "endpoints": []}),
            )
        };
        let hand = of(json!({"kubernetes.io/service-name": "db",
                             "endpointslice.kubernetes.io/managed-by": "e2e-test"}));
        assert_eq!(by_hand_for(&hand), Some("db"));
        let unlabelled = of(json!({"kubernetes.io/service-name": "db"}));
        assert_eq!(by_hand_for(&unlabelled), Some("db"));
        for controller in TENANT_CONTROLLERS {
            let computed = of(json!({"kubernetes.io/service-name": "db",
                                     "endpointslice.kubernetes.io/managed-by": controller}));
            assert_eq!(by_hand_for(&computed), None, "{controller}");
        }
        assert_eq!(by_hand_for(&of(json!({"app": "db"}))), None);
    }

    #[test]
    fn the_copy_names_the_service_copy_and_keeps_only_allowed_addresses() {
        let s = slice(json!({
            "metadata": {"name": "db-1", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "db",
                                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io-not"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.244.0.9"], "conditions": {"ready": true}, "nodeName": "n1",
                 "targetRef": {"kind": "Pod", "name": "db-0"}, "hostname": "db-0",
                 "hints": {"forZones": [{"name": "a"}]}},
                {"addresses": ["10.96.0.1"], "conditions": {"ready": true}},
                {"addresses": ["192.0.2.10", "10.0.0.7"]}
            ],
            "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]
        }));
        let mut tr = translator();
        tr.allow.endpoint_cidrs = vec!["192.0.2.0/24".into()];
        let own = BTreeSet::from(["10.244.0.9".to_string()]);
        let host_name = host_name_of(&tr, &s.metadata);
        let (copy, dropped) = translate_with(&tr, &s, &host_name, &own);
        let labels = copy.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_SERVICE_NAME], tr.host_name("default", "db"));
        assert_eq!(labels[LABEL_MANAGED_BY], MANAGED_BY_SYNCER);
        let addresses: Vec<&Vec<String>> = copy
            .endpoints
            .iter()
            .flatten()
            .map(|e| &e.addresses)
            .collect();
        assert_eq!(
            addresses,
            [
                &vec!["10.244.0.9".to_string()],
                &vec!["192.0.2.10".to_string()]
            ]
        );
        let first = &copy.endpoints.as_ref().unwrap()[0];
        assert!(first.target_ref.is_none() && first.node_name.is_none() && first.hints.is_none());
        assert_eq!(first.hostname.as_deref(), Some("db-0"));
        assert_eq!(copy.ports, s.ports);
        assert_eq!(dropped.len(), 2, "{dropped:?}");
        assert!(dropped[0].contains("10.96.0.1") && dropped[1].contains("10.0.0.7"));
    }

    #[test]
    fn a_forged_managed_by_never_hands_the_copy_to_a_host_controller() {
        let s = slice(json!({
            "metadata": {"name": "x", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "db",
                                    "endpointslice.kubernetes.io/managed-by": "some-host-controller"}},
            "addressType": "IPv4", "endpoints": []
        }));
        let tr = translator();
        let (copy, _) = translate_with(&tr, &s, "x", &BTreeSet::new());
        let labels = copy.metadata.labels.unwrap();
        assert_eq!(labels[LABEL_MANAGED_BY], MANAGED_BY_SYNCER);
        assert_eq!(labels[LABEL_SERVICE_NAME], tr.host_name("default", "db"));
    }
}
