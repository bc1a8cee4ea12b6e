//! How much storage one tenant claim may ask of the host: the IsolationProfile's
//! `allow.maxClaimSize`, compared by exact value (a claim of the cap and one byte more is over).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use tenantplane_api::Allowances;
use tenantplane_api::quantity::Quantity;

/// Why a claim asking for `requests` and `limits` (its `spec.resources`) may not reach the host
/// under `allow.maxClaimSize`; empty when it may.
pub fn claim_size_refusals(
    allow: &Allowances,
    requests: Option<&BTreeMap<String, ApiQuantity>>,
    limits: Option<&BTreeMap<String, ApiQuantity>>,
) -> Vec<String> {
    let Some(cap_text) = &allow.max_claim_size else {
        return vec![];
    };
    let cap_text = cap_text.0.as_str();
    let Some(cap) = Quantity::parse(cap_text) else {
        // Admission checks the profile; a cap that still cannot be read opens nothing.
        return vec![format!(
            "the IsolationProfile's allow.maxClaimSize {cap_text:?} is not a quantity, so no claim can be checked against it; the platform team must fix it"
        )];
    };
    let mut out = Vec::new();
    for (field, asked) in [("requests", requests), ("limits", limits)] {
        let Some(asked) = asked.and_then(|m| m.get("storage")) else {
            continue;
        };
        let text = asked.0.as_str();
        match Quantity::parse(text) {
            Some(size) if !size.exceeds(cap) => {}
            Some(_) => out.push(format!(
                "spec.resources.{field}.storage {text} is more than the IsolationProfile's allow.maxClaimSize of {cap_text}; ask for at most {cap_text}"
            )),
            None => out.push(format!(
                "spec.resources.{field}.storage {text:?} cannot be compared with the IsolationProfile's allow.maxClaimSize of {cap_text}; ask for at most {cap_text}, written like 10Gi"
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn storage(q: &str) -> BTreeMap<String, ApiQuantity> {
        BTreeMap::from([("storage".to_string(), ApiQuantity(q.to_string()))])
    }

    fn capped(cap: &str) -> Allowances {
        Allowances {
            max_claim_size: Some(cap.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_claim_over_the_cap_is_refused_naming_size_cap_and_setting() {
        let refusals = claim_size_refusals(&capped("100Gi"), Some(&storage("1Pi")), None);
        assert_eq!(
            refusals,
            [
                "spec.resources.requests.storage 1Pi is more than the IsolationProfile's allow.maxClaimSize of 100Gi; ask for at most 100Gi"
            ]
        );
        let limits = claim_size_refusals(
            &capped("100Gi"),
            Some(&storage("1Gi")),
            Some(&storage("101Gi")),
        );
        assert_eq!(limits.len(), 1);
        assert!(limits[0].contains("spec.resources.limits.storage 101Gi"));
    }

    #[test]
    fn the_cap_is_compared_exactly() {
        let allow = capped("100Gi");
        for ok in [
            "100Gi",
            "107374182400",
            "102400Mi",
            "1Gi",
            "0",
            "99999999999",
        ] {
            assert!(
                claim_size_refusals(&allow, Some(&storage(ok)), None).is_empty(),
                "{ok}"
            );
        }
        for over in [
            "107374182401",
            "100.000000001Gi",
            "102401Mi",
            "108G",
            "1e12",
            "1e40",
        ] {
            assert_eq!(
                claim_size_refusals(&allow, Some(&storage(over)), None).len(),
                1,
                "{over}"
            );
        }
    }

    #[test]
    fn no_cap_lets_any_size_through_and_an_unreadable_one_refuses() {
        let none = Allowances::default();
        assert!(claim_size_refusals(&none, Some(&storage("1Pi")), None).is_empty());
        assert!(claim_size_refusals(&capped("100Gi"), None, None).is_empty());
        let unreadable = claim_size_refusals(&capped("100Gi"), Some(&storage("lots")), None);
        assert!(
            unreadable[0].contains("cannot be compared"),
            "{unreadable:?}"
        );
        let broken = claim_size_refusals(&capped("big"), Some(&storage("1Gi")), None);
        assert!(
            broken[0].contains("allow.maxClaimSize \"big\""),
            "{broken:?}"
        );
        let zero = claim_size_refusals(&capped("0"), Some(&storage("1")), None);
        assert_eq!(zero.len(), 1, "a cap of 0 admits no storage");
    }
}
