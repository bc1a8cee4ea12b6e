//! What an earlier release put in a tenant and this one no longer wants, removed by the add-on
//! pass so an upgraded tenant ends up as a new one.
//!
//! - The admission policy `tenantplane-no-ephemeral-containers` (and its binding): ephemeral
//!   containers were refused until the syncer could start them in the host copy; now they run
//!   (`kinds::pods::ephemeral`).

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{Api, DeleteParams};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::error::Result;
use crate::naming::LABEL_SYNCED_FROM;

/// The name of the retired policy (and its binding) that refused ephemeral containers.
pub const EPHEMERAL_CONTAINERS: &str = "tenantplane-no-ephemeral-containers";

/// Is `labels`' owner tenant `tenant`'s, made by the syncer (never a tenant's own object)?
fn ours(labels: &std::collections::BTreeMap<String, String>, tenant: &str) -> bool {
    labels.get(LABEL_SYNCED_FROM).map(String::as_str) == Some(tenant)
}

async fn remove<K>(api: Api<K>, name: &str, tenant: &str) -> Result<()>
where
    K: Resource + Clone + std::fmt::Debug + DeserializeOwned,
{
    if let Some(live) = api.get_opt(name).await?
        && ours(live.labels(), tenant)
    {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Remove from tenant `name` what earlier releases put there and this one does not want.
pub async fn remove_retired(tenant: &Client, name: &str) -> Result<()> {
    remove(
        Api::<ValidatingAdmissionPolicyBinding>::all(tenant.clone()),
        EPHEMERAL_CONTAINERS,
        name,
    )
    .await?;
    remove(
        Api::<ValidatingAdmissionPolicy>::all(tenant.clone()),
        EPHEMERAL_CONTAINERS,
        name,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn only_the_syncers_own_object_of_that_name_is_removed() {
        let of = |v: &str| BTreeMap::from([(LABEL_SYNCED_FROM.to_string(), v.to_string())]);
        assert!(ours(&of("dev"), "dev"));
        assert!(!ours(&of("other"), "dev"));
        assert!(!ours(&BTreeMap::new(), "dev"));
    }
}
