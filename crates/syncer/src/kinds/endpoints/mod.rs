//! A Service's endpoints, both kinds: Endpoints go down only for selector-less Services, whose
//! Endpoints a person wrote; the host computes the rest from its own pods. EndpointSlices written
//! by hand for such a Service go down the same way ([`slices`]). What both share is here: whose
//! endpoints are a person's ([`written_by_hand`], [`selectorless`]), which addresses a copy may
//! name ([`left_out`]), and which copies a pod's coming or going wakes ([`wake_stale`]).

pub mod slices;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{EndpointSubset, Endpoints, Service};
use kube::ResourceExt;

use crate::allow;
use crate::copy::CopyDown;
use crate::copy_down_kind;
use crate::key::Key;
use crate::kind_trait::Kind;
use crate::tell::Review;
use crate::tenant::Tenant;
use crate::translate::Translator;

/// Endpoints, copied down for selector-less Services only.
pub struct EndpointsKind;

copy_down_kind!(EndpointsKind, Endpoints, "Endpoints", to_host.endpoints as "endpoints");

impl CopyDown for EndpointsKind {
    fn wanted(cx: &Tenant, ep: &Endpoints) -> bool {
        let (ns, name) = (ep.namespace().unwrap_or_default(), ep.name_any());
        written_by_hand(cx, &ns, &name) && Self::synced(cx, &ep.metadata)
    }

    /// Without the tenant's caches no address is known to be its own: only the profile's CIDRs.
    fn translate(tr: &Translator, ep: &Endpoints, host_name: &str) -> Endpoints {
        translate_with(tr, ep, host_name, &BTreeSet::new()).0
    }

    fn translate_in(
        cx: &Tenant,
        ep: &Endpoints,
        host_name: &str,
        _: Option<&Endpoints>,
    ) -> Endpoints {
        translate_with(&cx.tr, ep, host_name, &cx.own_pod_ips()).0
    }

    fn review_in(cx: &Tenant, ep: &Endpoints, _: Option<&Endpoints>) -> Review {
        let mut dropped = cx.tr.annotations(Self::NAME, &ep.metadata).1;
        dropped.extend(host_subsets(&cx.tr, ep, &cx.own_pod_ips()).1);
        Review {
            refused: vec![],
            dropped,
        }
    }
}

/// Are the endpoints of tenant Service `ns/name` a person's to write (it syncs, has no selector,
/// and is not the tenant API server's), so theirs go down as written, filtered? The host computes
/// every other Service's endpoints from its own pods.
pub fn written_by_hand(cx: &Tenant, ns: &str, name: &str) -> bool {
    !crate::naming::is_tenant_api(ns, name)
        && cx
            .tenant_get::<Service>(ns, name)
            .is_some_and(|s| selectorless(&s) && cx.syncs::<Service>(&s.metadata))
}

/// Does Service `t` leave its Endpoints to a person (no selector, or an empty one, and not
/// ExternalName)? The one definition the Service, Endpoints and EndpointSlice kinds share.
pub fn selectorless(t: &Service) -> bool {
    t.spec.as_ref().is_none_or(|s| {
        s.selector.as_ref().is_none_or(|sel| sel.is_empty())
            && s.type_.as_deref() != Some("ExternalName")
    })
}

/// May a copy name address `ip`: one of this tenant's own pods (`own`) or inside the profile's
/// `allow.endpointCIDRs`? `None`: yes; otherwise the sentence that says why it is left out.
pub fn left_out(tr: &Translator, own: &BTreeSet<String>, ip: &str) -> Option<String> {
    (!own.contains(ip) && !allow::in_cidrs(&tr.allow.endpoint_cidrs, ip)).then(|| {
        format!(
            "address {ip} is left out: it is not one of this tenant's pods nor inside the IsolationProfile's allow.endpointCIDRs"
        )
    })
}

/// A pod copy came, changed or went: queue the Endpoints whose copy no longer holds what it
/// should (an address of a pod that is gone, or of one that has come), so an address leaves a
/// copy with its pod rather than on a later pass.
pub fn wake_stale(cx: &Tenant) {
    // Read only when something written by hand is there to compare.
    let own = std::cell::LazyCell::new(|| cx.own_pod_ips());
    slices::wake_stale(cx, &own);
    let wanted = cx
        .tenant_list::<Endpoints>()
        .into_iter()
        .filter(|ep| EndpointsKind::wanted(cx, ep));
    for ep in wanted {
        let (ns, name) = (ep.namespace().unwrap_or_default(), ep.name_any());
        let host_name = cx.tr.host_name(&ns, &name);
        let live = cx.host_copy::<Endpoints>(&host_name, &ns, &name);
        let should = translate_with(&cx.tr, &ep, &host_name, &own).0;
        if live.is_none_or(|live| addresses(&live) != addresses(&should)) {
            cx.queue.add(Key::of::<EndpointsKind>(ns, name));
        }
    }
}

/// A pod of namespace `ns` got a new address: queue everything written by hand there (Endpoints
/// and EndpointSlices), which may name it now.
pub fn wake_namespace(cx: &Tenant, ns: &str) {
    for ep in cx.tenant_list::<Endpoints>() {
        if ep.namespace().as_deref() == Some(ns) {
            cx.queue.add(Key::for_object::<EndpointsKind>(&*ep));
        }
    }
    slices::wake_namespace(cx, ns);
}

/// Every address of `ep`, ready or not, in order.
fn addresses(ep: &Endpoints) -> Vec<(bool, String)> {
    let mut out: Vec<(bool, String)> = ep
        .subsets
        .iter()
        .flatten()
        .flat_map(|s| {
            let ready = s.addresses.iter().flatten().map(|a| (true, a.ip.clone()));
            let not_ready = s
                .not_ready_addresses
                .iter()
                .flatten()
                .map(|a| (false, a.ip.clone()));
            ready.chain(not_ready)
        })
        .collect();
    out.sort();
    out
}

/// The host copy of tenant Endpoints: only addresses of this tenant's own pods (`own`) or inside
/// the profile's `allow.endpointCIDRs`, so a host Service can never be pointed at the host API,
/// the control plane or anyone else's pods; and a sentence per address left out. `host_name`
/// names the copy.
pub fn translate_with(
    tr: &Translator,
    ep: &Endpoints,
    host_name: &str,
    own: &BTreeSet<String>,
) -> (Endpoints, Vec<String>) {
    let (subsets, dropped) = host_subsets(tr, ep, own);
    let endpoints = Endpoints {
        metadata: tr.host_meta(EndpointsKind::NAME, &ep.metadata, host_name),
        subsets,
    };
    (endpoints, dropped)
}

/// The most addresses one Endpoints copy holds, as kube-controller-manager's endpoints controller
/// keeps (it marks the rest `endpoints.kubernetes.io/over-capacity`).
pub const MAX_ADDRESSES: usize = 1000;

/// The addresses of `ep` its copy keeps (see [`translate_with`]), and a sentence per address
/// left out.
fn host_subsets(
    tr: &Translator,
    ep: &Endpoints,
    own: &BTreeSet<String>,
) -> (Option<Vec<EndpointSubset>>, Vec<String>) {
    let mut dropped = Vec::new();
    let mut subsets = ep.subsets.clone();
    for s in subsets.iter_mut().flatten() {
        for list in [s.addresses.as_mut(), s.not_ready_addresses.as_mut()]
            .into_iter()
            .flatten()
        {
            list.retain(|a| match left_out(tr, own, &a.ip) {
                Some(why) => {
                    dropped.push(why);
                    false
                }
                None => true,
            });
            for a in list.iter_mut() {
                // Tenant object references mean nothing on the host.
                a.target_ref = None;
                a.node_name = None;
            }
        }
    }
    // Past the first MAX_ADDRESSES, as the host's own endpoints controller truncates: every host
    // node's proxy programs each address.
    let mut room = MAX_ADDRESSES;
    let mut past = 0;
    for s in subsets.iter_mut().flatten() {
        for list in [s.addresses.as_mut(), s.not_ready_addresses.as_mut()]
            .into_iter()
            .flatten()
        {
            let keep = list.len().min(room);
            past += list.len() - keep;
            list.truncate(keep);
            room -= keep;
        }
    }
    if past > 0 {
        dropped.push(format!(
            "{past} addresses past the first {MAX_ADDRESSES} are left out of the host copy (the most one Endpoints holds, as Kubernetes' own endpoints controller keeps); use EndpointSlices"
        ));
    }
    // A subset whose every address was left out is no subset: the host refuses one with ports
    // and no address (422 "must specify addresses or notReadyAddresses"), and the refused write
    // would keep the address the copy had. Without any, the copy has no subsets at all.
    let subsets = subsets
        .map(|all| {
            all.into_iter()
                .filter(|s| {
                    let has = |l: &Option<Vec<_>>| l.as_ref().is_some_and(|l| !l.is_empty());
                    has(&s.addresses) || has(&s.not_ready_addresses)
                })
                .collect::<Vec<_>>()
        })
        .filter(|all| !all.is_empty());
    (subsets, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::tests::{host_name_of, translator};
    use serde_json::json;

    #[test]
    fn tenant_references_are_dropped_from_addresses() {
        let ep: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "default"},
            "subsets": [{"addresses": [{"ip": "10.1.2.3", "nodeName": "n",
                "targetRef": {"kind": "Pod", "name": "db-0"}}], "ports": [{"port": 5432}]}]
        }))
        .unwrap();
        let own = BTreeSet::from(["10.1.2.3".to_string()]);
        let (host, dropped) = translate_with(
            &translator(),
            &ep,
            &host_name_of(&translator(), &ep.metadata),
            &own,
        );
        let a = &host.subsets.unwrap()[0].addresses.clone().unwrap()[0];
        assert_eq!(a.ip, "10.1.2.3");
        assert!(a.target_ref.is_none() && a.node_name.is_none());
        assert!(dropped.is_empty());
    }

    #[test]
    fn addresses_compare_ready_and_not_ready_apart_and_in_any_order() {
        let ep = |v: serde_json::Value| -> Endpoints {
            serde_json::from_value(json!({"metadata": {"name": "db"}, "subsets": v})).unwrap()
        };
        let a = ep(json!([{"addresses": [{"ip": "10.0.0.2"}, {"ip": "10.0.0.1"}]}]));
        let b =
            ep(json!([{"addresses": [{"ip": "10.0.0.1"}]}, {"addresses": [{"ip": "10.0.0.2"}]}]));
        let c = ep(
            json!([{"addresses": [{"ip": "10.0.0.1"}], "notReadyAddresses": [{"ip": "10.0.0.2"}]}]),
        );
        assert_eq!(addresses(&a), addresses(&b));
        assert_ne!(addresses(&a), addresses(&c));
    }

    #[test]
    fn only_own_pods_and_allowed_cidrs_stay_in_the_copy() {
        let ep: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "default"},
            "subsets": [{"addresses": [{"ip": "10.96.0.1"}, {"ip": "10.244.0.9"}, {"ip": "192.0.2.10"}],
                         "notReadyAddresses": [{"ip": "10.244.1.1"}], "ports": [{"port": 5432}]}]
        }))
        .unwrap();
        let mut tr = translator();
        tr.allow.endpoint_cidrs = vec!["192.0.2.0/24".into()];
        let own = BTreeSet::from(["10.244.0.9".to_string()]);
        let (host, dropped) = translate_with(&tr, &ep, &host_name_of(&tr, &ep.metadata), &own);
        let subset = &host.subsets.unwrap()[0];
        let ips: Vec<&str> = subset
            .addresses
            .iter()
            .flatten()
            .map(|a| a.ip.as_str())
            .collect();
        assert_eq!(ips, ["10.244.0.9", "192.0.2.10"]);
        assert!(subset.not_ready_addresses.as_ref().unwrap().is_empty());
        assert_eq!(dropped.len(), 2, "{dropped:?}");
        assert!(dropped[0].contains("10.96.0.1"));
    }

    #[test]
    fn an_endpoints_copy_holds_at_most_a_thousand_addresses() {
        let ips: Vec<String> = (0..1200)
            .map(|i| format!("10.244.{}.{}", i / 250, i % 250))
            .collect();
        let ep: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "default"},
            "subsets": [{"addresses": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
                         "ports": [{"port": 5432}]}]
        }))
        .unwrap();
        let tr = translator();
        let own: BTreeSet<String> = ips.iter().cloned().collect();
        let (host, dropped) = translate_with(&tr, &ep, &host_name_of(&tr, &ep.metadata), &own);
        assert_eq!(addresses(&host).len(), MAX_ADDRESSES);
        assert_eq!(dropped.len(), 1);
        assert!(
            dropped[0].starts_with("200 addresses past the first 1000"),
            "{dropped:?}"
        );
    }

    /// The host refuses a subset with ports and no address (422), and the refused write kept a
    /// gone pod's address in the copy: a subset left empty goes, and so does the list.
    #[test]
    fn a_subset_left_without_addresses_is_no_subset() {
        let ep: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "default"},
            "subsets": [{"addresses": [{"ip": "10.244.0.7"}], "ports": [{"port": 5432}]},
                        {"notReadyAddresses": [{"ip": "10.244.0.9"}], "ports": [{"port": 80}]}]
        }))
        .unwrap();
        let tr = translator();
        let name = host_name_of(&tr, &ep.metadata);
        let own = BTreeSet::from(["10.244.0.9".to_string()]);
        let (host, _) = translate_with(&tr, &ep, &name, &own);
        let subsets = host.subsets.unwrap();
        assert_eq!(subsets.len(), 1);
        assert_eq!(subsets[0].ports.as_ref().unwrap()[0].port, 80);
        let (host, dropped) = translate_with(&tr, &ep, &name, &BTreeSet::new());
        assert_eq!(host.subsets, None);
        assert_eq!(dropped.len(), 2);
        let body = serde_json::to_value(&host).unwrap();
        assert!(body.get("subsets").is_none(), "{body}");
    }
}
