//! What every translation shares: the host name of a tenant object, the host metadata of a copy
//! with its ownership marks, and the host selector of a tenant label selector. The translation of
//! each kind lives in the kind's module; all of it is pure and unit-tested.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use kube::api::ObjectMeta;

use crate::naming::{self, TenantRef, Virtual};

/// What translation needs to know about the tenant and the host.
#[derive(Clone, Debug)]
pub struct Translator {
    /// The TenantCluster: every copy is owned by it, so the garbage collector removes the copies
    /// with it, and only copies it owns are taken for copies.
    pub tenant: TenantRef,
    /// The tenant's host namespace, where every copy lives.
    pub host_namespace: String,
    /// The cluster IP of the tenant API server's host Service; pods reach it on port 443, as
    /// they would reach `kubernetes.default` (`KUBERNETES_SERVICE_HOST`/`_PORT`).
    pub api_ip: String,
    /// The Service range the tenant allocates from (the host's): a host address outside it is
    /// never forced on a tenant Service.
    pub service_cidr: String,
    /// The profile's node selector, which every pod copy carries.
    pub node_selector: BTreeMap<String, String>,
    /// The profile's tolerations, which every pod copy carries.
    pub tolerations: Vec<Toleration>,
    /// What tenant objects may ask of the host (the IsolationProfile's `allow`).
    pub allow: tenantplane_api::Allowances,
    /// The limits the host's LimitRange gives a container that sets none (the IsolationProfile's
    /// `limitRange.default`): a request above one is refused with what to set.
    pub default_limits: BTreeMap<String, tenantplane_api::QuantityString>,
    /// What virtual Nodes name as their kubelet.
    pub kubelet: Option<crate::spec::KubeletEndpoint>,
}

/// The tenant object a tenant object's metadata names.
pub fn virtual_ref(meta: &ObjectMeta) -> Virtual {
    Virtual {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
    }
}

impl Translator {
    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.tenant.name
    }

    /// The host name of tenant object `namespace/name`. A converge computes it once, and hands
    /// it to the cache lookup and the translation.
    pub fn host_name(&self, namespace: &str, name: &str) -> String {
        naming::host_name_for(&self.tenant.name, namespace, name)
    }

    /// Host metadata for the copy, named `host_name`, of a tenant object of `kind`: the tenant's
    /// labels in their host form, the annotations the profile allows on the kind (reserved keys
    /// never), plus the ownership marks and the owner reference.
    pub fn host_meta(&self, kind: &str, meta: &ObjectMeta, host_name: &str) -> ObjectMeta {
        let of = virtual_ref(meta);
        let mut labels = naming::host_labels(&self.tenant.name, meta.labels.as_ref());
        labels.extend(naming::owner_labels(
            &self.tenant.name,
            &of.namespace,
            &of.name,
        ));
        let (mut annotations, _) = self.annotations(kind, meta);
        annotations.extend(naming::owner_annotations(&self.tenant, &of));
        ObjectMeta {
            name: Some(host_name.to_string()),
            namespace: Some(self.host_namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![self.tenant.owner.clone()]),
            ..Default::default()
        }
    }

    /// The annotations a copy of `kind` keeps of `meta`'s, and what it leaves out, said.
    pub fn annotations(
        &self,
        kind: &str,
        meta: &ObjectMeta,
    ) -> (BTreeMap<String, String>, Vec<String>) {
        crate::allow::annotations(
            &self.allow,
            kind,
            naming::copyable(meta.annotations.as_ref()),
        )
    }

    /// The host form of a tenant label key.
    pub fn label_key(&self, key: &str) -> String {
        naming::host_label_key(&self.tenant.name, key)
    }

    /// The host labels that select the copies of tenant pods in `namespace` labelled `selector`.
    pub fn host_selector(
        &self,
        namespace: &str,
        selector: &BTreeMap<String, String>,
    ) -> BTreeMap<String, String> {
        let mut s = naming::host_labels(&self.tenant.name, Some(selector));
        s.insert(naming::LABEL_SYNCED_FROM.into(), self.tenant.name.clone());
        s.insert(
            naming::LABEL_VIRTUAL_NAMESPACE.into(),
            naming::label_value(namespace),
        );
        s
    }

    /// The tenant object a host object is this tenant's copy of (ownership checked).
    pub fn copy_of(&self, meta: &ObjectMeta) -> Option<Virtual> {
        naming::copy_of(meta, &self.tenant)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn translator() -> Translator {
        Translator {
            tenant: crate::naming::tests::tenant_ref("dev", "tc-uid"),
            host_namespace: "team-dev".into(),
            api_ip: "10.96.0.10".into(),
            service_cidr: "10.96.0.0/12".into(),
            node_selector: BTreeMap::from([("pool".to_string(), "tenants".to_string())]),
            tolerations: vec![],
            allow: Default::default(),
            default_limits: BTreeMap::new(),
            kubelet: None,
        }
    }

    /// The host name of the tenant object `meta` names, as a converge computes it.
    pub fn host_name_of(tr: &Translator, meta: &ObjectMeta) -> String {
        tr.host_name(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        )
    }

    #[test]
    fn a_copy_is_owned_by_the_tenant_cluster_and_carries_its_uid() {
        let t = translator();
        let meta = ObjectMeta {
            name: Some("conf".into()),
            namespace: Some("default".into()),
            uid: Some("u1".into()),
            labels: Some(BTreeMap::from([(
                naming::LABEL_SYNCED_FROM.to_string(),
                "other".to_string(),
            )])),
            ..Default::default()
        };
        let host = t.host_meta("ConfigMap", &meta, &host_name_of(&t, &meta));
        assert_eq!(host.name.as_deref(), Some("conf-x-default-x-dev"));
        assert_eq!(host.owner_references.as_ref().unwrap()[0].uid, "tc-uid");
        assert_eq!(
            host.labels.as_ref().unwrap()[naming::LABEL_SYNCED_FROM],
            "dev",
            "the tenant cannot spoof it"
        );
        assert_eq!(
            host.annotations.as_ref().unwrap()[naming::ANNOTATION_TENANT_UID],
            "tc-uid"
        );
        let of = t.copy_of(&host).unwrap();
        assert_eq!(
            (of.namespace.as_str(), of.name.as_str()),
            ("default", "conf")
        );
    }
}
