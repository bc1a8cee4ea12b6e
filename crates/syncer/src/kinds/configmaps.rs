//! ConfigMaps go down when a synced pod uses them, or all of them when the policy says so.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;

use crate::copy::CopyDown;
use crate::copy_down_kind;
use crate::kind::Kind;
use crate::kinds::pods;
use crate::tenant::Tenant;
use crate::translate::Translator;

pub struct ConfigMaps;

copy_down_kind!(ConfigMaps, ConfigMap, "ConfigMap");

impl CopyDown for ConfigMaps {
    fn wanted(cx: &Tenant, cm: &ConfigMap) -> bool {
        let setting = &cx.policy.to_host.config_maps;
        let (ns, name) = (cm.namespace().unwrap_or_default(), cm.name_any());
        setting.enabled
            && cx.selected(Self::NAME, &cm.metadata)
            && (setting.all || pods::referenced(cx, &ns, |r| r.config_maps.contains(&name)))
    }

    fn translate(tr: &Translator, cm: &ConfigMap) -> ConfigMap {
        ConfigMap {
            metadata: tr.host_meta(Self::NAME, &cm.metadata),
            data: cm.data.clone(),
            binary_data: cm.binary_data.clone(),
            immutable: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::tests::translator;
    use serde_json::json;

    #[test]
    fn a_config_map_keeps_its_data_under_the_host_name() {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "conf", "namespace": "default", "uid": "c1"},
            "data": {"a": "1"}, "immutable": true
        }))
        .unwrap();
        let host = ConfigMaps::translate(&translator(), &cm);
        assert_eq!(host.metadata.name.as_deref(), Some("conf-x-default-x-dev"));
        assert_eq!(host.data.unwrap()["a"], "1");
        assert_eq!(
            host.immutable, None,
            "the copy follows edits of the tenant's"
        );
    }
}
