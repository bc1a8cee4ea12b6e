//! The tenant namespace's ResourceQuota and LimitRange, from the IsolationProfile and the
//! TenantCluster: what the host counts of a tenant, and the container defaults.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    LimitRange, LimitRangeItem, LimitRangeSpec, ResourceQuota, ResourceQuotaSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tenantplane_api::quantity::{ParsedQuantity, Quantity as ExactQuantity};
use tenantplane_api::{IsolationProfile, QuantityString, TenantCluster};

use super::meta::{identity, owned_metadata};
use crate::{Error, names};

/// The quota key of what all claims of the namespace request together.
const REQUESTS_STORAGE: &str = "requests.storage";

/// The tenant's storage cap: its own `resources.storage`, never above the profile's (the
/// profile is the platform team's; the TenantCluster is the team's). The smaller is chosen by
/// exact value; a value that cannot be read (admission checks both) loses to one that can.
fn storage_cap(tenant: Option<&ParsedQuantity>, profile: Option<&str>) -> Option<String> {
    match (tenant, profile) {
        (Some(t), Some(p)) => match (t.value(), ExactQuantity::parse(p)) {
            (Some(tq), Some(pq)) if tq.exceeds(pq) => Some(p.to_string()),
            (Some(_), _) => Some(t.to_string()),
            (None, _) => Some(p.to_string()),
        },
        (Some(t), None) => Some(t.to_string()),
        (None, p) => p.map(str::to_string),
    }
}

/// The ResourceQuota: every kind's object count and what the profile opens beyond cpu and
/// memory ([`tenantplane_api::Allowances::quota_keys`]), the profile's own hard limits over
/// them (per StorageClass ones, `<class>.storageclass.storage.k8s.io/requests.storage`, among
/// them); and, when the profile enforces quota, the tenant's cpu and memory as caps on what the
/// namespace requests (control plane and synced pods together) and its storage as the cap on
/// what its claims request (`requests.storage`). Limits are not capped in sum: the control
/// plane's limit is the whole cap by itself.
pub fn resource_quota(
    tc: &TenantCluster,
    profile: &IsolationProfile,
) -> Result<ResourceQuota, Error> {
    let quota = &profile.spec.resource_quota;
    let (tenant, _) = identity(tc)?;
    // Every kind's count and what the profile lets pods consume beyond cpu and memory are
    // counted whether or not the tenant's own caps are enforced: nothing a tenant puts on the
    // host goes uncounted. The profile's own hard limit of the same key wins.
    let mut hard = profile.spec.allow.quota_keys();
    hard.extend(quota.hard.iter().map(|(k, v)| (k.clone(), v.0.clone())));
    if quota.enforce {
        if let Some(cpu) = &tc.spec.resources.cpu {
            hard.insert("requests.cpu".into(), cpu.to_string());
        }
        if let Some(memory) = &tc.spec.resources.memory {
            hard.insert("requests.memory".into(), memory.to_string());
        }
        if let Some(storage) = storage_cap(
            tc.spec.resources.storage.as_ref(),
            hard.get(REQUESTS_STORAGE).map(String::as_str),
        ) {
            hard.insert(REQUESTS_STORAGE.into(), storage);
        }
    }
    Ok(ResourceQuota {
        metadata: owned_metadata(tc, names::resource_quota(&tenant))?,
        spec: Some(ResourceQuotaSpec {
            hard: Some(hard.into_iter().map(|(k, v)| (k, Quantity(v))).collect()),
            ..Default::default()
        }),
        status: None,
    })
}

/// The LimitRange with the profile's container defaults, when it has any.
pub fn limit_range(
    tc: &TenantCluster,
    profile: &IsolationProfile,
) -> Result<Option<LimitRange>, Error> {
    let limits = &profile.spec.limit_range;
    if limits.default.is_empty() && limits.default_request.is_empty() {
        return Ok(None);
    }
    let (tenant, _) = identity(tc)?;
    let quantities = |values: &BTreeMap<String, QuantityString>| {
        (!values.is_empty()).then(|| {
            values
                .iter()
                .map(|(k, v)| (k.clone(), Quantity(v.0.clone())))
                .collect()
        })
    };
    Ok(Some(LimitRange {
        metadata: owned_metadata(tc, names::limit_range(&tenant))?,
        spec: Some(LimitRangeSpec {
            limits: vec![LimitRangeItem {
                type_: "Container".into(),
                default: quantities(&limits.default),
                default_request: quantities(&limits.default_request),
                ..Default::default()
            }],
        }),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures::{profile, tenant};

    #[test]
    fn quota_caps_come_from_the_tenant_resources() {
        let quota = resource_quota(&tenant(), &profile()).unwrap();
        let hard = quota.spec.unwrap().hard.unwrap();
        assert_eq!(hard["requests.cpu"].0, "2");
        assert_eq!(hard["requests.memory"].0, "2Gi");
        assert!(
            !hard.contains_key("limits.cpu"),
            "the control plane's limit alone is the cap"
        );
        assert_eq!(hard["pods"].0, "100");
        let owner = &quota.metadata.owner_references.unwrap()[0];
        assert_eq!(owner.kind, "TenantCluster");
        assert_eq!(owner.controller, Some(true));
    }

    #[test]
    fn quota_counts_storage_never_above_the_profiles_cap() {
        let storage = |own: Option<&str>, profile_cap: Option<&str>| {
            let mut tc = tenant();
            tc.spec.resources.storage = own.map(ParsedQuantity::from);
            let mut p = profile();
            p.spec.resource_quota.hard.remove(REQUESTS_STORAGE);
            if let Some(cap) = profile_cap {
                p.spec
                    .resource_quota
                    .hard
                    .insert(REQUESTS_STORAGE.into(), cap.into());
            }
            let quota = resource_quota(&tc, &p).unwrap();
            let hard = quota.spec.unwrap().hard.unwrap();
            hard.get(REQUESTS_STORAGE).map(|q| q.0.clone())
        };
        // The shipped profile caps storage: every enforced quota counts it.
        let shipped = resource_quota(&tenant(), &profile()).unwrap();
        assert!(
            !shipped.spec.unwrap().hard.unwrap()[REQUESTS_STORAGE]
                .0
                .is_empty(),
            "restricted counts requests.storage"
        );
        assert_eq!(
            storage(Some("50Gi"), Some("200Gi")).as_deref(),
            Some("50Gi")
        );
        assert_eq!(
            storage(Some("1Pi"), Some("200Gi")).as_deref(),
            Some("200Gi"),
            "a team cannot raise the platform's cap"
        );
        assert_eq!(
            storage(Some("214748364801"), Some("200Gi")).as_deref(),
            Some("200Gi"),
            "one byte over is over"
        );
        assert_eq!(
            storage(Some("214748364800"), Some("200Gi")).as_deref(),
            Some("214748364800")
        );
        assert_eq!(storage(Some("10Gi"), None).as_deref(), Some("10Gi"));
        assert_eq!(storage(None, Some("200Gi")).as_deref(), Some("200Gi"));
        assert_eq!(storage(None, None), None);
        assert_eq!(storage(Some("lots"), Some("1Ti")).as_deref(), Some("1Ti"));
    }

    #[test]
    fn per_class_storage_caps_of_the_profile_reach_the_quota() {
        let mut p = profile();
        let key = "fast.storageclass.storage.k8s.io/requests.storage";
        p.spec.resource_quota.hard.insert(key.into(), "20Gi".into());
        let quota = resource_quota(&tenant(), &p).unwrap();
        assert_eq!(quota.spec.unwrap().hard.unwrap()[key].0, "20Gi");
    }

    /// Unenforced, the quota still counts every kind and what the profile opens beyond cpu and
    /// memory (node disk, and any resource `allow.resources` lists), but not the tenant's cpu.
    fn hard_of(p: &IsolationProfile) -> BTreeMap<String, Quantity> {
        resource_quota(&tenant(), p)
            .unwrap()
            .spec
            .unwrap()
            .hard
            .unwrap()
    }

    #[test]
    fn an_unenforced_quota_still_counts_every_kind_and_what_the_profile_opens() {
        let mut p = profile();
        p.spec.resource_quota.enforce = false;
        p.spec
            .allow
            .resources
            .insert("example.com/gpu".into(), "2".into());
        let hard = hard_of(&p);
        assert!(!hard.contains_key("requests.cpu"), "{hard:?}");
        assert_eq!(hard["requests.ephemeral-storage"].0, "512Gi");
        assert_eq!(hard["requests.example.com/gpu"].0, "2");
        assert_eq!(hard["pods"].0, "100", "the profile's own count wins");
        assert_eq!(hard["count/endpointslices.discovery.k8s.io"].0, "2k");
        // Enforced, the profile's own hard limit of the same key wins over the default total.
        p.spec.resource_quota.enforce = true;
        p.spec
            .resource_quota
            .hard
            .insert("requests.ephemeral-storage".into(), "50Gi".into());
        let hard = hard_of(&p);
        assert_eq!(hard["requests.ephemeral-storage"].0, "50Gi");
        assert_eq!(hard["requests.example.com/gpu"].0, "2");
    }

    #[test]
    fn limit_range_carries_the_defaults() {
        let lr = limit_range(&tenant(), &profile()).unwrap().unwrap();
        let item = &lr.spec.unwrap().limits[0];
        assert_eq!(item.default.as_ref().unwrap()["cpu"].0, "500m");
        assert_eq!(item.default_request.as_ref().unwrap()["memory"].0, "128Mi");
    }
}
