//! The host identity of a tenant's workloads: every host copy of a tenant pod runs as a
//! ServiceAccount of the tenant's own, never the host namespace's `default`, whose image pull
//! secrets and cloud identity the platform team may have given it for something else.

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};

use crate::naming::{self, SYNCER_MANAGER, TenantRef};

/// The name of the ServiceAccount tenant `tenant`'s pod copies run as.
pub fn workload_service_account_name(tenant: &str) -> String {
    format!("{tenant}-workloads")
}

/// That ServiceAccount: owned by the TenantCluster, no token mounted, and no pull secrets (a
/// copy pulls with the ones its tenant pod names, translated).
pub fn workload_service_account(tenant: &TenantRef, namespace: &str) -> ServiceAccount {
    ServiceAccount {
        metadata: ObjectMeta {
            name: Some(workload_service_account_name(&tenant.name)),
            namespace: Some(namespace.to_string()),
            labels: Some(
                [(naming::LABEL_SYNCED_FROM.to_string(), tenant.name.clone())]
                    .into_iter()
                    .collect(),
            ),
            owner_references: Some(vec![tenant.owner.clone()]),
            ..Default::default()
        },
        automount_service_account_token: Some(false),
        image_pull_secrets: None,
        secrets: None,
    }
}

/// The workloads' ServiceAccount could not be applied: which, and what the host said.
#[derive(Debug, thiserror::Error)]
#[error(
    "applying ServiceAccount {namespace}/{name}, which tenant pods run as on the host: {message}"
)]
pub struct IdentityError {
    namespace: String,
    name: String,
    message: String,
}

/// Apply the workloads' ServiceAccount; the error says what failed, for the syncer's health.
pub async fn ensure(
    host: &Client,
    tenant: &TenantRef,
    namespace: &str,
) -> Result<(), IdentityError> {
    let sa = workload_service_account(tenant, namespace);
    let name = workload_service_account_name(&tenant.name);
    Api::<ServiceAccount>::namespaced(host.clone(), namespace)
        .patch(
            &name,
            &PatchParams::apply(SYNCER_MANAGER).force(),
            &Patch::Apply(&sa),
        )
        .await
        .map(drop)
        .map_err(|e| IdentityError {
            namespace: namespace.to_string(),
            name: name.clone(),
            message: match e {
                kube::Error::Api(s) => s.message,
                other => other.to_string(),
            },
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    #[test]
    fn the_workloads_account_mounts_no_token_and_lends_no_pull_secret() {
        let tenant = TenantRef {
            name: "dev".into(),
            owner: OwnerReference {
                api_version: "tenantplane.io/v1alpha1".into(),
                kind: "TenantCluster".into(),
                name: "dev".into(),
                uid: "tc-uid".into(),
                ..Default::default()
            },
        };
        let sa = workload_service_account(&tenant, "team-dev");
        assert_eq!(sa.metadata.name.as_deref(), Some("dev-workloads"));
        assert_eq!(sa.automount_service_account_token, Some(false));
        assert_eq!(sa.image_pull_secrets, None);
        assert_eq!(sa.metadata.owner_references.unwrap()[0].uid, "tc-uid");
    }
}
