//! ConfigMaps go down when a synced pod uses them, or all of them when the policy says so.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;

use crate::copy::CopyDown;
use crate::copy_down_kind;
use crate::kind_trait::Kind;
use crate::kinds::pods::references;
use crate::kinds::secrets;
use crate::tell::Review;
use crate::tenant::Tenant;
use crate::translate::Translator;

/// ConfigMaps, copied down when the policy or a synced pod asks for them.
pub struct ConfigMaps;

copy_down_kind!(ConfigMaps, ConfigMap, "ConfigMap", to_host.config_maps as "configMaps");

impl CopyDown for ConfigMaps {
    fn wanted(cx: &Tenant, cm: &ConfigMap) -> bool {
        let setting = &cx.policy.to_host.config_maps;
        let (ns, name) = (cm.namespace().unwrap_or_default(), cm.name_any());
        Self::synced(cx, &cm.metadata)
            && (setting.all || references::referenced(cx, &ns, |r| r.config_maps.contains(&name)))
    }

    fn translate(tr: &Translator, cm: &ConfigMap, host_name: &str) -> ConfigMap {
        ConfigMap {
            metadata: tr.host_meta(Self::NAME, &cm.metadata, host_name),
            data: cm.data.clone(),
            binary_data: cm.binary_data.clone(),
            immutable: None,
        }
    }

    fn wake_dependents(cx: &Tenant, cm: &ConfigMap) {
        let bytes = crate::allow::data_bytes(cm.data.as_ref(), cm.binary_data.as_ref());
        let name = cm.name_any();
        secrets::wake_users(cx, &cm.metadata, bytes, |r| r.config_maps.contains(&name));
    }

    fn review(tr: &Translator, cm: &ConfigMap) -> Review {
        let bytes = crate::allow::data_bytes(cm.data.as_ref(), cm.binary_data.as_ref());
        secrets::review(tr, Self::NAME, &cm.metadata, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::tests::{host_name_of, translator};
    use serde_json::json;

    #[test]
    fn annotations_naming_other_namespaces_stay_in_the_tenant() {
        let mut tr = translator();
        tr.allow.annotations.config_maps = vec!["*".into()];
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "conf", "namespace": "default", "annotations": {
                "reflector.v1.k8s.emberstack.com/reflects": "kube-system/cluster-info",
                "example.com/team": "web"}}
        }))
        .unwrap();
        let host = ConfigMaps::translate(&tr, &cm, &host_name_of(&tr, &cm.metadata));
        let a = host.metadata.annotations.unwrap();
        assert!(!a.contains_key("reflector.v1.k8s.emberstack.com/reflects"));
        assert_eq!(a["example.com/team"], "web");
        let review = ConfigMaps::review(&tr, &cm);
        assert!(
            review.dropped[0].contains("namespace \"kube-system\""),
            "{review:?}"
        );
    }

    #[test]
    fn data_over_allow_max_data_bytes_is_refused_with_its_size() {
        let mut tr = translator();
        let cm = |text: usize, raw: usize| -> ConfigMap {
            serde_json::from_value(json!({
                "metadata": {"name": "blob", "namespace": "default"},
                "data": {"t": "x".repeat(text)},
                "binaryData": {"r": k8s_openapi::ByteString(vec![0; raw])}
            }))
            .unwrap()
        };
        // 900 KiB and two keys of a byte each.
        let big = cm(900 * 1024, 0);
        assert!(ConfigMaps::review(&tr, &big).refused.is_empty(), "no cap");
        tr.allow.max_data_bytes = Some("256Ki".into());
        let refused = ConfigMaps::review(&tr, &big).refused;
        assert!(refused[0].contains("921602 bytes"), "{refused:?}");
        assert!(refused[0].contains("allow.maxDataBytes of 256Ki"));
        // Keys and both maps count: 2 keys and 262,142 bytes of values are exactly the cap.
        assert!(
            ConfigMaps::review(&tr, &cm(131_071, 131_071))
                .refused
                .is_empty()
        );
        assert_eq!(
            ConfigMaps::review(&tr, &cm(131_071, 131_072)).refused.len(),
            1
        );
    }

    #[test]
    fn a_config_map_keeps_its_data_under_the_host_name() {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "conf", "namespace": "default", "uid": "c1"},
            "data": {"a": "1"}, "immutable": true
        }))
        .unwrap();
        let tr = translator();
        let host = ConfigMaps::translate(&tr, &cm, &host_name_of(&tr, &cm.metadata));
        assert_eq!(host.metadata.name.as_deref(), Some("conf-x-default-x-dev"));
        assert_eq!(host.data.unwrap()["a"], "1");
        assert_eq!(
            host.immutable, None,
            "the copy follows edits of the tenant's"
        );
    }
}
