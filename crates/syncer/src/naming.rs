//! Name translation and ownership marks, in one place. A tenant object `name` in tenant
//! namespace `namespace` of tenant `tenant` lives on the host as `<name>-x-<namespace>-x-<tenant>`
//! in the tenant's host namespace. When that is longer than 63 characters, or could be read as
//! another triple (a part contains `-x-`), the name is cut and a hash of the whole triple is added,
//! so two triples never share a host name.
//!
//! Ownership is decided here too: a host object is a tenant's copy only when the marks the syncer
//! wrote at creation (labels, annotations with the TenantCluster's UID) agree with its owner
//! reference to that TenantCluster (copies made before the UID was recorded: the owner reference). A tenant can write labels and annotations into templates the
//! host expands (an ephemeral volume's claim), never an owner reference, so marks alone are not
//! trusted.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;

/// Every synced host object carries these labels…
pub const LABEL_SYNCED_FROM: &str = "tenantplane.io/synced-from";
/// The tenant object's namespace when it is a valid label value, else its hash.
pub const LABEL_VIRTUAL_NAMESPACE: &str = "tenantplane.io/virtual-namespace";
/// The tenant object's name when it is a valid label value, else its hash.
pub const LABEL_VIRTUAL_NAME: &str = "tenantplane.io/virtual-name";
/// …and these annotations, which hold the full values.
pub const ANNOTATION_TENANT: &str = "tenantplane.io/tenant";
/// The tenant object's namespace.
pub const ANNOTATION_VIRTUAL_NAMESPACE: &str = "tenantplane.io/virtual-namespace";
/// The tenant object's name.
pub const ANNOTATION_VIRTUAL_NAME: &str = "tenantplane.io/virtual-name";
/// The tenant object's UID.
pub const ANNOTATION_VIRTUAL_UID: &str = "tenantplane.io/virtual-uid";
/// The UID of the TenantCluster the copy was made for, recorded at creation.
pub const ANNOTATION_TENANT_UID: &str = "tenantplane.io/tenant-uid";
/// A hash of what the syncer or the controller last applied (see `converge`).
pub const ANNOTATION_APPLIED_HASH: &str = "tenantplane.io/applied-hash";
/// The tenant service account a host pod runs as (for people reading the host).
pub const ANNOTATION_SERVICE_ACCOUNT: &str = "tenantplane.io/service-account";
/// On a copy: the address its tenant pod shows as `status.hostIP` (its virtual Node's, the
/// operator's kubelet endpoint), for the downward API.
pub const ANNOTATION_HOST_IP: &str = "tenantplane.io/host-ip";
/// On a pod copy: the tenant pod's `metadata.generation` the copy was last made or updated
/// from, so the tenant pod's `status.observedGeneration` says which of its specs runs.
pub const ANNOTATION_TENANT_GENERATION: &str = "tenantplane.io/tenant-generation";
/// On a host token Secret: when its token should be minted again (RFC 3339).
pub const ANNOTATION_TOKEN_REFRESH: &str = "tenantplane.io/token-refresh-at";
/// Tenant labels and annotations under this prefix are not copied: a tenant cannot claim to be
/// another tenant's object, or the operator's.
pub const RESERVED_PREFIX: &str = "tenantplane.io/";
/// The field manager of the syncer's writes, on both sides.
pub const SYNCER_MANAGER: &str = "tenantplane-syncer";

const SEPARATOR: &str = "-x-";
const MAX_NAME: usize = 63;
const HASH_CHARS: usize = 16;

fn hash(parts: &[&str]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, parts.join("/").as_bytes());
    digest
        .as_ref()
        .iter()
        .take(HASH_CHARS / 2)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The host name of `tenant`'s object `namespace/name` (namespace empty for cluster-scoped
/// kinds). Outermost first, as every name function here takes its arguments.
pub fn host_name_for(tenant: &str, namespace: &str, name: &str) -> String {
    let plain = format!("{name}{SEPARATOR}{namespace}{SEPARATOR}{tenant}");
    let separators = plain
        .as_bytes()
        .windows(SEPARATOR.len())
        .filter(|w| *w == SEPARATOR.as_bytes())
        .count();
    if plain.len() <= MAX_NAME && separators == 2 {
        return plain;
    }
    let keep = MAX_NAME - HASH_CHARS - 1;
    let mut prefix: String = plain.chars().take(keep).collect();
    // A name must end with an alphanumeric character.
    while prefix.ends_with(['-', '.']) {
        prefix.pop();
    }
    format!("{prefix}-{}", hash(&[tenant, namespace, name]))
}

/// The host Secret holding a pod's tenant service-account tokens. A translated name never ends in
/// `.token` (it ends with the tenant's name, which has no dot, or a hash), so this is no other
/// object's name.
pub fn token_secret_name(host_pod: &str) -> String {
    format!("{host_pod}.token")
}

/// `value` as a label value: itself when it is one, else its hash.
pub fn label_value(value: &str) -> String {
    let valid = value.len() <= MAX_NAME
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && value
            .chars()
            .next()
            .is_none_or(|c| c.is_ascii_alphanumeric())
        && value
            .chars()
            .last()
            .is_none_or(|c| c.is_ascii_alphanumeric());
    if valid {
        value.to_string()
    } else {
        hash(&[value])
    }
}

/// Which tenant object a host object stands for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Virtual {
    /// The object's tenant namespace; empty when cluster-scoped.
    pub namespace: String,
    /// The object's name in the tenant.
    pub name: String,
    /// The object's UID in the tenant; empty on copies made before it was recorded.
    pub uid: String,
}

/// The ownership labels of a host copy of `namespace/name` (namespace empty when cluster-scoped).
pub fn owner_labels(tenant: &str, namespace: &str, name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_SYNCED_FROM.to_string(), tenant.to_string()),
        (LABEL_VIRTUAL_NAMESPACE.to_string(), label_value(namespace)),
        (LABEL_VIRTUAL_NAME.to_string(), label_value(name)),
    ])
}

/// The TenantCluster a syncer works for: its name and UID, and the owner reference every copy
/// carries.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantRef {
    /// The TenantCluster's name.
    pub name: String,
    /// The owner reference to the TenantCluster that every copy carries.
    pub owner: OwnerReference,
}

impl TenantRef {
    /// The TenantCluster's UID.
    pub fn uid(&self) -> &str {
        &self.owner.uid
    }
}

/// The ownership annotations of a host copy.
pub fn owner_annotations(tenant: &TenantRef, of: &Virtual) -> BTreeMap<String, String> {
    BTreeMap::from([
        (ANNOTATION_TENANT.to_string(), tenant.name.clone()),
        (ANNOTATION_TENANT_UID.to_string(), tenant.uid().to_string()),
        (
            ANNOTATION_VIRTUAL_NAMESPACE.to_string(),
            of.namespace.clone(),
        ),
        (ANNOTATION_VIRTUAL_NAME.to_string(), of.name.clone()),
        (ANNOTATION_VIRTUAL_UID.to_string(), of.uid.clone()),
    ])
}

/// The label selector of everything synced from `tenant`.
pub fn synced_selector(tenant: &str) -> String {
    format!("{LABEL_SYNCED_FROM}={tenant}")
}

/// The tenant object a host object was made for, if the syncer of `tenant` made it: its marks
/// name this TenantCluster (UID included) and so does its owner reference.
pub fn copy_of(meta: &ObjectMeta, tenant: &TenantRef) -> Option<Virtual> {
    let uid = tenant.uid();
    let owned = meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid && o.kind == tenant.owner.kind && o.controller == Some(true));
    let recorded = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_TENANT_UID))
        .map(String::as_str);
    // Copies made before the UID was recorded carry only the owner reference (which a tenant
    // cannot write either); their next apply records it. A recorded UID must agree.
    if !owned || recorded.is_some_and(|r| r != uid) {
        return None;
    }
    virtual_of(meta, &tenant.name)
}

/// The tenant object a host object's marks name, if they name `tenant`. Marks can be forged:
/// decisions use [`copy_of`].
pub fn virtual_of(meta: &ObjectMeta, tenant: &str) -> Option<Virtual> {
    let labels = meta.labels.as_ref()?;
    if labels.get(LABEL_SYNCED_FROM).map(String::as_str) != Some(tenant) {
        return None;
    }
    let a = meta.annotations.as_ref()?;
    if a.get(ANNOTATION_TENANT).map(String::as_str) != Some(tenant) {
        return None;
    }
    Some(Virtual {
        namespace: a.get(ANNOTATION_VIRTUAL_NAMESPACE)?.clone(),
        name: a.get(ANNOTATION_VIRTUAL_NAME)?.clone(),
        uid: a.get(ANNOTATION_VIRTUAL_UID).cloned().unwrap_or_default(),
    })
}

/// A tenant's labels or annotations without the reserved ones.
pub fn copyable(map: Option<&BTreeMap<String, String>>) -> BTreeMap<String, String> {
    map.into_iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with(RESERVED_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The host form of tenant label key `key` for copies of `tenant`: `<tenant>.tenant.tenantplane.io/<name>`,
/// so that no host selector written for something else (another team's Service or
/// NetworkPolicy, a monitoring rule) matches a tenant's copy. `<name>` is the key itself when it
/// has no prefix, `<prefix>_<name>` when it has one, and `h__` and a hash when that would not fit
/// or the key holds `_` (so two tenant keys never share a host key).
pub fn host_label_key(tenant: &str, key: &str) -> String {
    let readable = match key.split_once('/') {
        None => Some(key.to_string()),
        Some((prefix, name)) => Some(format!("{prefix}_{name}")),
    }
    .filter(|n| n.len() <= MAX_NAME && n.matches('_').count() == usize::from(key.contains('/')));
    let name = readable.unwrap_or_else(|| format!("h__{}", hash(&[key])));
    format!("{tenant}.{HOST_LABEL_DOMAIN}/{name}")
}

/// The domain of the host form of tenant label keys, after the tenant's name.
pub const HOST_LABEL_DOMAIN: &str = "tenant.tenantplane.io";

/// A tenant's labels as a host copy of `tenant` carries them: reserved keys left out, every other
/// key in its host form.
pub fn host_labels(
    tenant: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    copyable(labels)
        .into_iter()
        .map(|(k, v)| (host_label_key(tenant, &k), v))
        .collect()
}

/// Is tenant Service `ns/name` the tenant API server's own (`default/kubernetes`)?
pub fn is_tenant_api(ns: &str, name: &str) -> bool {
    ns == "default" && name == "kubernetes"
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn short_names_read_as_the_triple() {
        assert_eq!(
            host_name_for("dev", "default", "web-0"),
            "web-0-x-default-x-dev"
        );
    }

    #[test]
    fn long_names_are_cut_with_a_hash() {
        let long = "a".repeat(80);
        let name = host_name_for("dev", "default", &long);
        assert_eq!(name.len(), 63);
        assert_ne!(name, host_name_for("dev", "default", &format!("{long}b")));
    }

    #[test]
    fn ambiguous_triples_do_not_collide() {
        // Both would read "a-x-x-b-x-t" in the plain form.
        let one = host_name_for("t", "b", "a-x");
        let two = host_name_for("t", "x-b", "a");
        assert_ne!(one, two);
        let three = host_name_for("t", "c", "a-x-b");
        let four = host_name_for("t", "b-x-c", "a");
        assert_ne!(three, four);
    }

    #[test]
    fn names_from_hand_edited_annotations_do_not_panic() {
        let name = host_name_for("dev", "défault", "wéb-ü");
        assert!(!name.is_empty());
    }

    #[test]
    fn label_values_fall_back_to_a_hash() {
        assert_eq!(label_value("web"), "web");
        let long = label_value(&"a".repeat(100));
        assert_eq!(long.len(), 16);
        assert_eq!(label_value(""), "");
    }

    pub(crate) fn tenant_ref(name: &str, uid: &str) -> TenantRef {
        TenantRef {
            name: name.into(),
            owner: OwnerReference {
                api_version: "tenantplane.io/v1alpha1".into(),
                kind: "TenantCluster".into(),
                name: name.into(),
                uid: uid.into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
        }
    }

    #[test]
    fn ownership_round_trips_and_refuses_other_tenants() {
        let dev = tenant_ref("dev", "tc-1");
        let of = Virtual {
            namespace: "default".into(),
            name: "web".into(),
            uid: "u1".into(),
        };
        let meta = ObjectMeta {
            labels: Some(owner_labels("dev", "default", "web")),
            annotations: Some(owner_annotations(&dev, &of)),
            owner_references: Some(vec![dev.owner.clone()]),
            ..Default::default()
        };
        assert_eq!(copy_of(&meta, &dev), Some(of.clone()));
        assert_eq!(virtual_of(&meta, "other"), None);
        // A later TenantCluster of the same name is another tenant.
        assert_eq!(copy_of(&meta, &tenant_ref("dev", "tc-2")), None);
        // Marks without the owner reference (written through a template) are forged.
        let forged = ObjectMeta {
            owner_references: None,
            ..meta.clone()
        };
        assert_eq!(virtual_of(&forged, "dev"), Some(of));
        assert_eq!(copy_of(&forged, &dev), None);
        // A copy made before the UID was recorded is still ours; one recording another UID is not.
        let mut unrecorded = meta.clone();
        unrecorded
            .annotations
            .as_mut()
            .unwrap()
            .remove(ANNOTATION_TENANT_UID);
        assert!(copy_of(&unrecorded, &dev).is_some());
        let mut other = meta;
        other
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANNOTATION_TENANT_UID.into(), "tc-2".into());
        assert_eq!(copy_of(&other, &dev), None);
    }

    #[test]
    fn reserved_keys_are_not_copied() {
        let map = BTreeMap::from([
            ("app".to_string(), "web".to_string()),
            (LABEL_SYNCED_FROM.to_string(), "someone-else".to_string()),
        ]);
        assert_eq!(copyable(Some(&map)).len(), 1);
    }

    fn dns_label() -> impl Strategy<Value = String> {
        "[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?"
    }

    proptest! {
        #[test]
        fn host_names_are_valid_and_distinct(
            a in (dns_label(), dns_label(), dns_label()),
            b in (dns_label(), dns_label(), dns_label()),
        ) {
            let x = host_name_for(&a.2, &a.1, &a.0);
            let y = host_name_for(&b.2, &b.1, &b.0);
            prop_assert!(x.len() <= 63);
            prop_assert!(x.chars().last().unwrap().is_ascii_alphanumeric());
            if a != b {
                prop_assert_ne!(x, y);
            }
        }
    }

    #[test]
    fn tenant_label_keys_get_a_host_form_of_their_own() {
        assert_eq!(
            host_label_key("dev", "app"),
            "dev.tenant.tenantplane.io/app"
        );
        assert_eq!(
            host_label_key("dev", "app.kubernetes.io/name"),
            "dev.tenant.tenantplane.io/app.kubernetes.io_name"
        );
        // `_` would make two keys meet; long keys would not fit: both are hashed.
        let underscored = host_label_key("dev", "a_b");
        assert!(underscored.starts_with("dev.tenant.tenantplane.io/h__"));
        assert_ne!(underscored, host_label_key("dev", "a/b"));
        let long = format!("{}/{}", "p".repeat(60), "n".repeat(60));
        let name = host_label_key("dev", &long);
        assert!(name.split_once('/').unwrap().1.len() <= 63, "{name}");
        assert_ne!(host_label_key("dev", "app"), host_label_key("prod", "app"));
        let labels = BTreeMap::from([
            ("app".to_string(), "web".to_string()),
            (LABEL_SYNCED_FROM.to_string(), "other".to_string()),
        ]);
        let host = host_labels("dev", Some(&labels));
        assert_eq!(host.len(), 1, "reserved keys stay out: {host:?}");
        assert_eq!(host["dev.tenant.tenantplane.io/app"], "web");
    }
}
