//! How much data one tenant ConfigMap or Secret may put on the host: the IsolationProfile's
//! `allow.maxDataBytes`. The quota counts these objects, not their bytes; with this cap the
//! bytes a tenant copies to the host are bounded too.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use tenantplane_api::Allowances;
use tenantplane_api::quantity::Quantity;

/// The bytes a ConfigMap or Secret stores: every key and value of `strings` (a ConfigMap's
/// `data`, a Secret's `stringData`) and of `bytes` (`binaryData`, a Secret's `data`). A key in
/// both counts once, as `strings`' (the API server lets `stringData` win).
pub fn data_bytes(
    strings: Option<&BTreeMap<String, String>>,
    bytes: Option<&BTreeMap<String, ByteString>>,
) -> usize {
    let in_strings = |k: &String| strings.is_some_and(|s| s.contains_key(k));
    let from_strings: usize = strings
        .into_iter()
        .flatten()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    let from_bytes: usize = bytes
        .into_iter()
        .flatten()
        .filter(|(k, _)| !in_strings(k))
        .map(|(k, v)| k.len() + v.0.len())
        .sum();
    from_strings.saturating_add(from_bytes)
}

/// The profile's `allow.maxDataBytes`, read once for many objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataCap {
    text: String,
    /// `None`: the cap cannot be read, and opens nothing.
    cap: Option<Quantity>,
}

impl DataCap {
    /// The cap of `allow`; `None` when the profile sets none (every size is copied).
    pub fn of(allow: &Allowances) -> Option<DataCap> {
        let text = allow.max_data_bytes.as_ref()?.0.clone();
        let cap = Quantity::parse(&text);
        Some(DataCap { text, cap })
    }

    /// Is data of `bytes` bytes more than the cap (or is the cap unreadable)?
    pub fn exceeded_by(&self, bytes: usize) -> bool {
        // Every usize reads as a quantity; were it not, it would be more than any cap.
        let size = Quantity::parse(&bytes.to_string()).unwrap_or(Quantity::MORE_THAN_COUNTED);
        self.cap.is_none_or(|cap| size.exceeds(cap))
    }

    /// Why a ConfigMap or Secret holding `bytes` bytes of data is not copied, said on it;
    /// `None` when it may be.
    pub fn refusal(&self, bytes: usize) -> Option<String> {
        let cap = &self.text;
        if self.cap.is_none() {
            // Admission checks the profile; a cap that still cannot be read opens nothing.
            return Some(format!(
                "the IsolationProfile's allow.maxDataBytes {cap:?} is not a quantity, so no ConfigMap or Secret can be checked against it; the platform team must fix it"
            ));
        }
        self.exceeded_by(bytes).then(|| format!(
            "its data (keys and values) is {bytes} bytes, more than the IsolationProfile's allow.maxDataBytes of {cap}: it is not copied to the host, and pods that use it are refused; keep it within {cap} (split it), or ask for a profile with a larger allow.maxDataBytes"
        ))
    }

    /// Why a pod using `kind` `name`, which holds `bytes` bytes of data, is refused; `None`
    /// when that object may be copied.
    pub fn pod_refusal(&self, kind: &str, name: &str, bytes: usize) -> Option<String> {
        let cap = &self.text;
        self.exceeded_by(bytes).then(|| match self.cap {
            Some(_) => format!(
                "{kind} {name} holds {bytes} bytes of data, more than the IsolationProfile's allow.maxDataBytes of {cap}, so it is not copied to the host and the pod could not run there"
            ),
            None => format!(
                "{kind} {name} cannot be checked against the IsolationProfile's allow.maxDataBytes {cap:?}, which is not a quantity; the platform team must fix it"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capped(cap: &str) -> DataCap {
        DataCap::of(&Allowances {
            max_data_bytes: Some(cap.into()),
            ..Default::default()
        })
        .unwrap()
    }

    fn strings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_bytes_stored_are_keys_and_values_of_both_maps_each_key_once() {
        assert_eq!(data_bytes(None, None), 0);
        let text = strings(&[("a", "12345"), ("bb", "")]);
        let raw = BTreeMap::from([
            ("c".to_string(), ByteString(vec![0; 10])),
            // Overridden by the string of the same key, as stringData overrides data.
            ("a".to_string(), ByteString(vec![0; 1000])),
        ]);
        assert_eq!(data_bytes(Some(&text), None), 6 + 2);
        assert_eq!(data_bytes(None, Some(&raw)), 11 + 1001);
        assert_eq!(data_bytes(Some(&text), Some(&raw)), 6 + 2 + 11);
    }

    #[test]
    fn data_over_the_cap_is_refused_naming_size_cap_and_setting() {
        let cap = capped("256Ki");
        assert_eq!(cap.refusal(262_144), None, "the cap itself fits");
        assert_eq!(cap.refusal(0), None);
        let said = cap.refusal(262_145).unwrap();
        assert!(said.contains("262145 bytes"), "{said}");
        assert!(
            said.contains("allow.maxDataBytes of 256Ki"),
            "names the setting and the cap: {said}"
        );
        let pod = cap.pod_refusal("ConfigMap", "blob-0", 921_610).unwrap();
        assert_eq!(
            pod,
            "ConfigMap blob-0 holds 921610 bytes of data, more than the IsolationProfile's allow.maxDataBytes of 256Ki, so it is not copied to the host and the pod could not run there"
        );
        assert_eq!(cap.pod_refusal("Secret", "small", 100), None);
    }

    #[test]
    fn the_cap_is_compared_exactly_whatever_its_notation() {
        for (cap, fits, over) in [
            ("256Ki", 262_144, 262_145),
            ("262144", 262_144, 262_145),
            ("0.25Mi", 262_144, 262_145),
            ("1k", 1000, 1001),
            ("1e3", 1000, 1001),
            ("1500m", 1, 2),
            ("0", 0, 1),
        ] {
            let c = capped(cap);
            assert!(!c.exceeded_by(fits), "{cap}: {fits}");
            assert!(c.exceeded_by(over), "{cap}: {over}");
        }
    }

    #[test]
    fn no_cap_copies_any_size_and_an_unreadable_one_refuses_all() {
        assert_eq!(DataCap::of(&Allowances::default()), None);
        let broken = capped("lots");
        let said = broken.refusal(1).unwrap();
        assert!(said.contains("allow.maxDataBytes \"lots\""), "{said}");
        assert!(broken.pod_refusal("Secret", "s", 0).is_some());
    }
}
