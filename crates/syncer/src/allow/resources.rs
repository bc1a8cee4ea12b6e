//! What a tenant pod may consume on a host node, decided name by name: `cpu`, `memory` and
//! `ephemeral-storage` always (the quota and the node disk caps count them), any other resource
//! (huge pages, extended and device resources) only where the profile's `allow.resources` lists
//! it, with the total its quota counts. Node disk is capped per container and per `emptyDir`,
//! and a host copy gets the profile's defaults where the tenant set none.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use tenantplane_api::allowances::EphemeralStorageCaps;
use tenantplane_api::quantity::Quantity;
use tenantplane_api::{Allowances, QuantityString};

use super::values::listed;

/// The resources every tenant pod may ask for: each is counted (cpu and memory by the quota a
/// TenantCluster's resources set, node disk by `allow.ephemeralStorage`).
pub const ALWAYS_ALLOWED: &[&str] = &["cpu", "memory", "ephemeral-storage"];

/// The node disk resource.
pub const DISK: &str = "ephemeral-storage";

/// Why a pod's resources may not reach the host under `allow`; empty when they may.
pub fn resource_refusals(allow: &Allowances, spec: &PodSpec) -> Vec<String> {
    let mut out = Vec::new();
    let extra: Vec<String> = allow.resources.keys().cloned().collect();
    let mut judge = |who: &str, r: Option<&ResourceRequirements>| {
        let requests = r.and_then(|r| r.requests.as_ref());
        let limits = r.and_then(|r| r.limits.as_ref());
        // Each name once, whether requested, limited or both (an extended resource's request
        // defaults to its limit).
        let names: std::collections::BTreeSet<&String> = requests
            .into_iter()
            .chain(limits)
            .flat_map(|m| m.keys())
            .collect();
        for name in names {
            if !ALWAYS_ALLOWED.contains(&name.as_str()) && !allow.resources.contains_key(name) {
                out.push(format!(
                    "{who} asks for resource {name}, which the IsolationProfile's allow.resources does not list{}",
                    listed(&extra)
                ));
            }
        }
        for (field, map) in [("requests", requests), ("limits", limits)] {
            let Some(asked) = map.and_then(|m| m.get(DISK)) else {
                continue;
            };
            if let Some(why) = over_cap(
                &asked.0,
                &allow.ephemeral_storage.max_per_container,
                "allow.ephemeralStorage.maxPerContainer",
            ) {
                out.push(format!("{who}: resources.{field}.ephemeral-storage {why}"));
            }
        }
    };
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
    {
        judge(&format!("container {:?}", c.name), c.resources.as_ref());
    }
    judge("the pod (spec.resources)", spec.resources.as_ref());
    for v in spec.volumes.iter().flatten() {
        let Some(size) = v.empty_dir.as_ref().and_then(|e| e.size_limit.as_ref()) else {
            continue;
        };
        if let Some(why) = over_cap(
            &size.0,
            &allow.ephemeral_storage.empty_dir_max,
            "allow.ephemeralStorage.emptyDirMax",
        ) {
            out.push(format!("volume {:?}: emptyDir.sizeLimit {why}", v.name));
        }
    }
    out
}

/// Why a container would be refused by the host's LimitRange, which gives a container without a
/// limit the profile's `limitRange.default` as its limit: its request is above that default.
/// Said here, naming the default and the field to set, because the tenant cannot see the host's
/// LimitRange and the host's own words ("must be less than or equal to cpu limit of 500m") name
/// a limit the tenant never set.
pub fn default_limit_refusals(
    defaults: &BTreeMap<String, QuantityString>,
    spec: &PodSpec,
) -> Vec<String> {
    let mut out = Vec::new();
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
    {
        let r = c.resources.as_ref();
        let requests = r.and_then(|r| r.requests.as_ref());
        let limits = r.and_then(|r| r.limits.as_ref());
        for (name, default) in defaults {
            if limits.is_some_and(|l| l.contains_key(name)) {
                continue;
            }
            let Some(asked) = requests.and_then(|m| m.get(name)) else {
                continue;
            };
            let above = Quantity::parse(&asked.0)
                .zip(Quantity::parse(&default.0))
                .is_some_and(|(asked, default)| asked.exceeds(default));
            if above {
                out.push(format!(
                    "container {:?} requests {name} {} and sets no {name} limit: on this host a container without one gets the IsolationProfile's default limit of {name} {} (its limitRange.default), and a request may not be above its limit; set resources.limits.{name} to at least {}",
                    c.name, asked.0, default.0, asked.0
                ));
            }
        }
    }
    out
}

/// Why quantity `asked` is more than the profile's `cap` (named `field`), or cannot be compared
/// with it; `None` when it is within.
fn over_cap(asked: &str, cap: &QuantityString, field: &str) -> Option<String> {
    let cap_text = cap.0.as_str();
    match (Quantity::parse(asked), Quantity::parse(cap_text)) {
        (Some(a), Some(c)) if !a.exceeds(c) => None,
        (_, None) => Some(format!(
            "cannot be checked: the IsolationProfile's {field} {cap_text:?} is not a quantity; the platform team must fix it"
        )),
        (Some(_), Some(_)) => Some(format!(
            "{asked} is more than the IsolationProfile's {field} of {cap_text}; ask for at most {cap_text}"
        )),
        (None, Some(_)) => Some(format!(
            "{asked:?} cannot be compared with the IsolationProfile's {field} of {cap_text}; write it like 10Gi"
        )),
    }
}

/// Give a host copy the profile's node disk defaults: an `ephemeral-storage` limit on each
/// container that sets none (its request, if unset, written as 0, or the API server would make
/// the limit the request and every container would reserve the default), and a `sizeLimit` on
/// each disk-backed `emptyDir` that has none.
pub fn bound_disk(caps: &EphemeralStorageCaps, spec: &mut PodSpec) {
    for c in spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut())
    {
        let r = c.resources.get_or_insert_with(Default::default);
        if r.limits.as_ref().is_some_and(|l| l.contains_key(DISK)) {
            continue;
        }
        let request = r
            .requests
            .get_or_insert_with(BTreeMap::new)
            .entry(DISK.into())
            .or_insert_with(|| ApiQuantity("0".into()))
            .clone();
        // A request above the default (within the cap, `resource_refusals`) is its own limit.
        let above = Quantity::parse(&request.0)
            .zip(Quantity::parse(&caps.default_limit.0))
            .is_some_and(|(asked, default)| asked.exceeds(default));
        let limit = if above {
            request
        } else {
            ApiQuantity(caps.default_limit.0.clone())
        };
        r.limits
            .get_or_insert_with(BTreeMap::new)
            .insert(DISK.into(), limit);
    }
    for v in spec.volumes.iter_mut().flatten() {
        if let Some(e) = v.empty_dir.as_mut()
            && e.medium.as_deref().is_none_or(str::is_empty)
            && e.size_limit.is_none()
        {
            e.size_limit = Some(ApiQuantity(caps.empty_dir_default.0.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn spec(v: Value) -> PodSpec {
        serde_json::from_value(v).unwrap()
    }

    /// The red team's pods: a GPU of another team's pool, all of a node's huge pages, a
    /// terabyte of node disk in a limit and in an emptyDir.
    fn greedy() -> PodSpec {
        spec(json!({
            "resources": {"requests": {"cpu": "1"}},
            "initContainers": [{"name": "init", "resources": {"limits": {"hugepages-2Mi": "2Gi", "memory": "2Gi"}}}],
            "containers": [
                {"name": "gpu", "resources": {"limits": {"example.com/gpu": "4"}, "requests": {"cpu": "100m"}}},
                {"name": "disk", "resources": {"limits": {"ephemeral-storage": "1Ti"}}}
            ],
            "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Ti"}},
                        {"name": "small", "emptyDir": {"sizeLimit": "1Gi"}}]
        }))
    }

    #[test]
    fn a_request_above_the_default_limit_it_does_not_set_is_refused_with_what_to_set() {
        let defaults: BTreeMap<String, QuantityString> = [
            ("cpu".into(), "500m".into()),
            ("memory".into(), "512Mi".into()),
        ]
        .into();
        let pod = spec(json!({
            "initContainers": [{"name": "init", "resources": {"requests": {"memory": "1Gi"}}}],
            "containers": [
                {"name": "big", "resources": {"requests": {"cpu": "8"}}},
                {"name": "limited", "resources": {"requests": {"cpu": "8"}, "limits": {"cpu": "8"}}},
                {"name": "small", "resources": {"requests": {"cpu": "500m", "memory": "64Mi"}}},
                {"name": "none"}
            ]
        }));
        let refused = default_limit_refusals(&defaults, &pod);
        assert_eq!(
            refused,
            [
                "container \"init\" requests memory 1Gi and sets no memory limit: on this host a container without one gets the IsolationProfile's default limit of memory 512Mi (its limitRange.default), and a request may not be above its limit; set resources.limits.memory to at least 1Gi",
                "container \"big\" requests cpu 8 and sets no cpu limit: on this host a container without one gets the IsolationProfile's default limit of cpu 500m (its limitRange.default), and a request may not be above its limit; set resources.limits.cpu to at least 8",
            ]
        );
        assert!(default_limit_refusals(&BTreeMap::new(), &pod).is_empty());
    }

    #[test]
    fn every_resource_name_is_decided_and_node_disk_is_capped() {
        let text = resource_refusals(&Allowances::default(), &greedy()).join("\n");
        for needle in [
            "container \"init\" asks for resource hugepages-2Mi, which the IsolationProfile's allow.resources does not list, which is empty",
            "container \"gpu\" asks for resource example.com/gpu, which",
            "container \"disk\": resources.limits.ephemeral-storage 1Ti is more than the IsolationProfile's allow.ephemeralStorage.maxPerContainer of 64Gi; ask for at most 64Gi",
            "volume \"scratch\": emptyDir.sizeLimit 1Ti is more than the IsolationProfile's allow.ephemeralStorage.emptyDirMax of 64Gi",
        ] {
            assert!(text.contains(needle), "{needle} missing from:\n{text}");
        }
        assert_eq!(text.lines().count(), 4, "{text}");
        let opened = Allowances {
            resources: BTreeMap::from([
                ("example.com/gpu".to_string(), "4".into()),
                ("hugepages-2Mi".to_string(), "2Gi".into()),
            ]),
            ephemeral_storage: EphemeralStorageCaps {
                max_per_container: "2Ti".into(),
                empty_dir_max: "2Ti".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(resource_refusals(&opened, &greedy()), Vec::<String>::new());
        // A cap of one byte more than asked lets it through; one byte less does not.
        let exact = spec(json!({"containers": [{"name": "c",
            "resources": {"requests": {"ephemeral-storage": "64Gi"}, "limits": {"ephemeral-storage": "68719476737"}}}]}));
        let text = resource_refusals(&Allowances::default(), &exact).join("\n");
        assert!(
            text.contains("limits.ephemeral-storage 68719476737"),
            "{text}"
        );
        assert!(!text.contains("requests"), "{text}");
    }

    #[test]
    fn a_copy_gets_the_disk_defaults_and_keeps_what_the_tenant_set() {
        let mut s = spec(json!({
            "containers": [
                {"name": "plain"},
                {"name": "asked", "resources": {"requests": {"ephemeral-storage": "1Gi"}, "limits": {"ephemeral-storage": "2Gi"}}},
                {"name": "requested", "resources": {"requests": {"ephemeral-storage": "1Gi", "cpu": "1"}}},
                {"name": "large", "resources": {"requests": {"ephemeral-storage": "20Gi"}}}
            ],
            "volumes": [{"name": "disk", "emptyDir": {}}, {"name": "ram", "emptyDir": {"medium": "Memory"}},
                        {"name": "sized", "emptyDir": {"sizeLimit": "1Gi"}}]
        }));
        bound_disk(&EphemeralStorageCaps::default(), &mut s);
        let r = |i: usize| serde_json::to_value(&s.containers[i].resources).unwrap();
        assert_eq!(
            r(0),
            json!({"limits": {"ephemeral-storage": "16Gi"}, "requests": {"ephemeral-storage": "0"}})
        );
        assert_eq!(
            r(1),
            json!({"limits": {"ephemeral-storage": "2Gi"}, "requests": {"ephemeral-storage": "1Gi"}})
        );
        assert_eq!(
            r(2),
            json!({"limits": {"ephemeral-storage": "16Gi"}, "requests": {"cpu": "1", "ephemeral-storage": "1Gi"}})
        );
        assert_eq!(
            r(3),
            json!({"limits": {"ephemeral-storage": "20Gi"}, "requests": {"ephemeral-storage": "20Gi"}})
        );
        let sizes: Vec<Option<String>> = s
            .volumes
            .unwrap()
            .iter()
            .map(|v| {
                v.empty_dir
                    .as_ref()
                    .unwrap()
                    .size_limit
                    .clone()
                    .map(|q| q.0)
            })
            .collect();
        assert_eq!(sizes, [Some("16Gi".into()), None, Some("1Gi".into())]);
    }
}
