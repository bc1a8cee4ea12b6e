//! ServiceAccounts go down when the policy says so, as names only: the host never mints tokens
//! for them (the tenant does, see `tokens`).

use k8s_openapi::api::core::v1::ServiceAccount;

use crate::copy::CopyDown;
use crate::copy_down_kind;
use kube::runtime::watcher;
use tenantplane_api::SyncPolicySpec;

use crate::kind_trait::{Kind, tenant_watch_config};
use crate::tenant::Tenant;
use crate::translate::Translator;

/// ServiceAccounts, copied down as names only when the policy says so.
pub struct ServiceAccounts;

copy_down_kind!(ServiceAccounts, ServiceAccount, "ServiceAccount", to_host.service_accounts as "serviceAccounts";
    fn tenant_watch(p: &SyncPolicySpec) -> Option<watcher::Config> {
        Self::enabled(p).then(tenant_watch_config)
    }
);

impl CopyDown for ServiceAccounts {
    fn wanted(cx: &Tenant, sa: &ServiceAccount) -> bool {
        Self::synced(cx, &sa.metadata)
    }

    fn translate(tr: &Translator, sa: &ServiceAccount, host_name: &str) -> ServiceAccount {
        ServiceAccount {
            metadata: tr.host_meta(Self::NAME, &sa.metadata, host_name),
            automount_service_account_token: Some(false),
            image_pull_secrets: None,
            secrets: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::tests::{host_name_of, translator};
    use serde_json::json;

    #[test]
    fn an_account_copy_mounts_no_host_token() {
        let sa: ServiceAccount = serde_json::from_value(json!({
            "metadata": {"name": "builder", "namespace": "ci"},
            "secrets": [{"name": "builder-token"}]
        }))
        .unwrap();
        let tr = translator();
        let host = ServiceAccounts::translate(&tr, &sa, &host_name_of(&tr, &sa.metadata));
        assert_eq!(host.metadata.name.as_deref(), Some("builder-x-ci-x-dev"));
        assert_eq!(host.automount_service_account_token, Some(false));
        assert_eq!(host.secrets, None);
    }
}
