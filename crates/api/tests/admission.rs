//! Every admission case, checked against the CRD schemas' own CEL rules without a cluster. The
//! same cases run against the real API server in the tenantplane crate's tests.

use kube::CustomResourceExt;
use tenantplane_api::validation::admission_errors;
use tenantplane_api::{IsolationProfile, SyncPolicy, TenantCluster};
use tenantplane_testenv::cases::admission_cases;

#[test]
fn every_admission_case_gets_the_expected_verdict_from_the_rules() {
    let cases = admission_cases();
    assert!(
        cases.len() >= 20,
        "the case file lost cases: {}",
        cases.len()
    );
    let mut failures = Vec::new();
    for case in &cases {
        let crd = match case.base.as_str() {
            "tenantcluster" => TenantCluster::crd(),
            "isolationprofile" => IsolationProfile::crd(),
            _ => SyncPolicy::crd(),
        };
        let errors = admission_errors(&crd, &case.object(), case.old_object().as_ref())
            .unwrap_or_else(|e| panic!("{}: the rules could not run: {e}", case.name));
        match &case.expect {
            None if !errors.is_empty() => failures.push(format!(
                "{}: expected acceptance, got {errors:?}",
                case.name
            )),
            Some(expected) if !errors.iter().any(|e| e.contains(expected.as_str())) => failures
                .push(format!(
                    "{}: expected {expected:?}, got {errors:?}",
                    case.name
                )),
            _ => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_refused_object_gets_one_message_per_broken_rule() {
    let object = serde_json::json!({
        "apiVersion": "tenantplane.io/v1alpha1",
        "kind": "TenantCluster",
        "metadata": {"name": "x", "namespace": "y"},
        "spec": {"kubernetesVersion": "latest", "controlPlane": {"replicas": 0}}
    });
    let errors = admission_errors(&TenantCluster::crd(), &object, None).unwrap();
    assert_eq!(errors.len(), 2, "{errors:?}");
}
