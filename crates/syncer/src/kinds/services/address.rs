//! Which cluster IP a tenant Service's host copy asks for. The host's Service range is the
//! tenant's too, so a copy can ask for the tenant's own address and the tenant Service keeps it;
//! the profile's `allow.chosenClusterIPs` says whether it may, and the addresses hosts hold by
//! convention (the range's first and tenth) are never asked for.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use tenantplane_api::cidr::Cidr;

use crate::naming::SYNCER_MANAGER;
use crate::translate::Translator;

/// Whether a new host copy of a tenant Service asks the host for the tenant's own cluster IP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnAddress {
    /// It asks (the host may still refuse an address it holds: then it allocates one).
    Asked,
    /// The host allocates the copy's address, and the tenant Service is made again with it;
    /// with a sentence for a tenant that chose its own.
    NotAsked(Option<String>),
}

/// The addresses of Service range `range` that hosts hold by convention: the network address,
/// the first address (the `kubernetes` Service) and the tenth (the cluster DNS on many hosts:
/// `.10`, or `::a`). A tenant never gets them, whatever its profile.
pub fn reserved_addresses(range: &str) -> Vec<IpAddr> {
    Cidr::parse(range)
        .map(|c| [0, 1, 10].into_iter().filter_map(|n| c.nth(n)).collect())
        .unwrap_or_default()
}

/// The reserved address (see [`reserved_addresses`]) live host copy `copy` holds, if it holds
/// one in a range larger than the allocator's static band (at most 256 addresses, which the
/// host hands out itself only once the rest is full): a copy made before such addresses were
/// kept from tenants.
pub fn squatted(tr: &Translator, copy: &Service) -> Option<IpAddr> {
    let range = Cidr::parse(&tr.service_cidr)?;
    let host_bits = if range.is_ipv4() { 32 } else { 128 } - u32::from(range.prefix());
    if host_bits <= 8 {
        return None;
    }
    let reserved = reserved_addresses(&tr.service_cidr);
    copy.spec
        .iter()
        .flat_map(|s| s.cluster_ips.iter().flatten().chain(s.cluster_ip.iter()))
        .filter_map(|ip| ip.parse::<IpAddr>().ok())
        .find(|ip| reserved.contains(ip))
}

/// Did a person (or their tool) set the cluster IP of `svc`, rather than the tenant's
/// allocator or the syncer? Read from managed fields, which a client can write: it decides only
/// whether the tenant is told, never what the host gives.
pub fn chose_cluster_ip(svc: &Service) -> bool {
    svc.metadata.managed_fields.iter().flatten().any(|m| {
        m.manager.as_deref() != Some(SYNCER_MANAGER)
            && m.fields_v1.as_ref().is_some_and(|f| {
                let spec = &f.0["f:spec"];
                !spec["f:clusterIP"].is_null() || !spec["f:clusterIPs"].is_null()
            })
    })
}

/// Whether a new copy of tenant Service `svc` asks for the tenant's cluster IP under the
/// profile's `allow.chosenClusterIPs` and the host's Service range `tr.service_cidr`.
pub fn own_address(tr: &Translator, svc: &Service) -> OwnAddress {
    let spec = svc.spec.as_ref();
    let mut ips: Vec<String> = spec.and_then(|s| s.cluster_ips.clone()).unwrap_or_default();
    ips.extend(spec.and_then(|s| s.cluster_ip.clone()));
    ips.retain(|ip| !ip.is_empty() && ip != "None");
    let Some(first) = ips.first().cloned() else {
        return OwnAddress::Asked;
    };
    let reserved = reserved_addresses(&tr.service_cidr);
    if let Some(ip) = ips
        .iter()
        .find(|ip| ip.parse::<IpAddr>().is_ok_and(|ip| reserved.contains(&ip)))
    {
        return OwnAddress::NotAsked(Some(format!(
            "spec.clusterIP {ip} is not given on the host: hosts hold the Service range's first and tenth addresses ({}) for their own Services (the cluster DNS among them), whatever the IsolationProfile's allow.chosenClusterIPs; the Service takes an address the host allocates",
            reserved
                .iter()
                .skip(1)
                .map(IpAddr::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    if !tr.allow.chosen_cluster_ips {
        return OwnAddress::NotAsked(chose_cluster_ip(svc).then(|| format!(
            "spec.clusterIP {first} is not asked of the host (the IsolationProfile's allow.chosenClusterIPs is off); the Service takes an address the host allocates"
        )));
    }
    OwnAddress::Asked
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::translate::tests::translator;
    use serde_json::json;

    /// Service `default/web` at `ip`, its address set by `manager` (none: by the allocator).
    pub(crate) fn at(ip: &str, manager: Option<&str>) -> Service {
        let managed = manager.map(|m| {
            json!([{"manager": m, "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:clusterIP": {}, "f:ports": {}}}}])
        });
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "managedFields": managed},
            "spec": {"clusterIP": ip, "clusterIPs": [ip], "ports": [{"port": 80}]}
        }))
        .unwrap()
    }

    #[test]
    fn the_ranges_first_and_tenth_addresses_are_never_asked_for() {
        let ips = |r: &str| -> Vec<String> {
            reserved_addresses(r)
                .iter()
                .map(IpAddr::to_string)
                .collect()
        };
        assert_eq!(
            ips("10.96.0.0/12"),
            ["10.96.0.0", "10.96.0.1", "10.96.0.10"]
        );
        assert_eq!(
            ips("fd00:10:96::/112"),
            ["fd00:10:96::", "fd00:10:96::1", "fd00:10:96::a"]
        );
        assert!(ips("not a range").is_empty());
        let mut tr = translator();
        tr.allow.chosen_cluster_ips = true;
        for ip in ["10.96.0.10", "10.96.0.1"] {
            for who in [Some("kubectl-create"), None] {
                let OwnAddress::NotAsked(Some(why)) = own_address(&tr, &at(ip, who)) else {
                    panic!("{ip} {who:?} was asked for");
                };
                assert!(
                    why.contains(ip) && why.contains("allow.chosenClusterIPs"),
                    "{why}"
                );
            }
        }
        assert_eq!(
            own_address(&tr, &at("10.96.7.7", Some("kubectl"))),
            OwnAddress::Asked
        );
    }

    #[test]
    fn a_copy_holding_a_reserved_address_is_found_unless_the_range_is_all_static_band() {
        let mut tr = translator();
        assert_eq!(
            squatted(&tr, &at("10.96.0.10", None)).map(|ip| ip.to_string()),
            Some("10.96.0.10".into())
        );
        assert_eq!(squatted(&tr, &at("10.96.7.7", None)), None);
        assert_eq!(squatted(&tr, &at("None", None)), None);
        // The host's own allocator gives these out in a range this small.
        tr.service_cidr = "10.96.0.0/24".into();
        assert_eq!(squatted(&tr, &at("10.96.0.10", None)), None);
    }

    #[test]
    fn without_the_setting_the_host_allocates_and_only_a_chosen_address_is_told() {
        let tr = translator();
        assert!(
            !tr.allow.chosen_cluster_ips,
            "off unless the profile says so"
        );
        let OwnAddress::NotAsked(Some(why)) = own_address(&tr, &at("10.96.7.7", Some("kubectl")))
        else {
            panic!("a chosen address was asked for");
        };
        assert!(
            why.contains("allow.chosenClusterIPs is off") && why.contains("10.96.7.7"),
            "{why}"
        );
        // Allocated by the tenant, or given by the syncer: made again quietly.
        assert_eq!(
            own_address(&tr, &at("10.96.7.7", None)),
            OwnAddress::NotAsked(None)
        );
        assert_eq!(
            own_address(&tr, &at("10.96.7.7", Some(SYNCER_MANAGER))),
            OwnAddress::NotAsked(None)
        );
        // Headless, or not allocated yet: nothing to ask for.
        assert_eq!(
            own_address(&tr, &at("None", Some("kubectl"))),
            OwnAddress::Asked
        );
        assert!(chose_cluster_ip(&at("None", Some("kubectl"))));
    }
}
