//! How many bytes one host copy may take, whatever field carries them: its labels and
//! annotations (`allow.maxMetadataBytes`), and the whole copy as the host stores it
//! (`allow.maxObjectBytes`, by kind). Measured on the copy the syncer is about to write, so what
//! the syncer derives (a translated name, a pod's environment) counts too.

use kube::api::ObjectMeta;
use serde::Serialize;
use tenantplane_api::Allowances;
use tenantplane_api::quantity::Quantity;

/// The metadata bound when the profile sets none.
const DEFAULT_METADATA: &str = "64Ki";

/// The bound of a kind's copies when the profile sets none: well above what real workloads write.
/// A ConfigMap or Secret holds up to 1 MiB of data, which its JSON carries in base64 (a third
/// more) beside its metadata: the API server's request limit of 1.5 MiB is its bound.
fn default_object_bytes(kind: &str) -> &'static str {
    match kind {
        "Pod" | "Endpoints" | "EndpointSlice" => "256Ki",
        "ConfigMap" | "Secret" => "1536Ki",
        "Service" | "Ingress" => "128Ki",
        _ => "32Ki",
    }
}

/// The bytes of a copy's labels and annotations, keys and values.
pub fn metadata_bytes(meta: &ObjectMeta) -> usize {
    [meta.labels.as_ref(), meta.annotations.as_ref()]
        .into_iter()
        .flatten()
        .flatten()
        .map(|(k, v)| k.len() + v.len())
        .sum()
}

/// Why the host copy `copy` of kind `kind` may not be written for its size; empty when it may.
pub fn byte_refusals<K: Serialize>(
    allow: &Allowances,
    kind: &str,
    meta: &ObjectMeta,
    copy: &K,
) -> Vec<String> {
    let mut out = Vec::new();
    let metadata = allow
        .max_metadata_bytes
        .as_ref()
        .map_or(DEFAULT_METADATA, |q| q.0.as_str());
    if let Some(why) = over(metadata_bytes(meta), metadata) {
        out.push(format!(
            "its labels and annotations take {why} the IsolationProfile's allow.maxMetadataBytes{}",
            default_said(allow.max_metadata_bytes.is_none())
        ));
    }
    let own = allow.max_object_bytes.get(kind);
    let cap = own.map_or(default_object_bytes(kind), |q| q.0.as_str());
    // A copy that cannot be written as JSON is no copy; its size is then unknown, and too large.
    let size = serde_json::to_vec(copy).map_or(usize::MAX, |v| v.len());
    if let Some(why) = over(size, cap) {
        out.push(format!(
            "its host copy takes {why} the IsolationProfile's allow.maxObjectBytes.{kind}{}",
            default_said(own.is_none())
        ));
    }
    out
}

fn default_said(default: bool) -> &'static str {
    if default { " (the default)" } else { "" }
}

/// `"<n> bytes, more than <cap> allowed by"` when `bytes` exceeds `cap`; `None` within it. A cap
/// that cannot be read (admission checks it) opens nothing.
fn over(bytes: usize, cap: &str) -> Option<String> {
    let size = Quantity::parse(&bytes.to_string()).unwrap_or(Quantity::MORE_THAN_COUNTED);
    match Quantity::parse(cap) {
        Some(c) if !size.exceeds(c) => None,
        Some(_) => Some(format!("{bytes} bytes, more than the {cap} allowed by")),
        None => Some(format!(
            "{bytes} bytes, which cannot be checked against {cap:?}, not a quantity, in"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::collections::BTreeMap;

    fn config_map(labels: usize, data: usize) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("c".into()),
                labels: Some(
                    (0..labels)
                        .map(|i| (format!("l{i:05}"), "v".repeat(90)))
                        .collect(),
                ),
                ..Default::default()
            },
            data: Some(BTreeMap::from([("k".to_string(), "x".repeat(data))])),
            ..Default::default()
        }
    }

    fn refusals(allow: &Allowances, cm: &ConfigMap) -> Vec<String> {
        byte_refusals(allow, "ConfigMap", &cm.metadata, cm)
    }

    /// The red team's ConfigMap: 684 KB of labels and little data.
    #[test]
    fn labels_count_as_bytes_as_data_does() {
        let allow = Allowances::default();
        let labelled = config_map(7003, 10);
        let said = refusals(&allow, &labelled);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].starts_with("its labels and annotations take 672288 bytes, more than the 64Ki allowed by the IsolationProfile's allow.maxMetadataBytes (the default)"),
            "{said:?}"
        );
        assert_eq!(
            refusals(&allow, &config_map(600, 1 << 20)),
            Vec::<String>::new()
        );
        // The whole copy: a kind's own bound, named.
        let capped = Allowances {
            max_object_bytes: BTreeMap::from([("ConfigMap".to_string(), "300Ki".into())]),
            ..Default::default()
        };
        let said = refusals(&capped, &config_map(0, 400 << 10));
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].contains("more than the 300Ki allowed by the IsolationProfile's allow.maxObjectBytes.ConfigMap")
                && !said[0].contains("default"),
            "{said:?}"
        );
        assert_eq!(
            refusals(&capped, &config_map(0, 200 << 10)),
            Vec::<String>::new()
        );
    }

    #[test]
    fn every_kind_has_a_default_above_what_real_objects_take() {
        for kind in [
            "Pod",
            "Service",
            "ConfigMap",
            "Secret",
            "Endpoints",
            "EndpointSlice",
            "Ingress",
            "PersistentVolumeClaim",
            "ServiceAccount",
        ] {
            let cap = Quantity::parse(default_object_bytes(kind)).unwrap();
            assert!(!Quantity::parse("32Ki").unwrap().exceeds(cap), "{kind}");
        }
        // A Secret of 1 MiB of data (base64 in its JSON) and 64Ki of metadata fits.
        let secret = k8s_openapi::api::core::v1::Secret {
            metadata: config_map(600, 0).metadata,
            data: Some(BTreeMap::from([(
                "k".to_string(),
                k8s_openapi::ByteString(vec![7; 1 << 20]),
            )])),
            ..Default::default()
        };
        let allow = Allowances::default();
        assert_eq!(
            byte_refusals(&allow, "Secret", &secret.metadata, &secret),
            Vec::<String>::new()
        );
    }
}
