//! What the work queue holds and a worker converges: a key naming one object of a kind. Below the
//! engine and the kinds, which both speak of keys.

use serde::Serialize;

use crate::host::HostObject;

/// What a worker converges: one object of a kind. The namespace is empty for cluster-scoped
/// kinds and for host Events, whose name is the host's.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    /// The kind, as its syncer names it (`Pod`).
    pub kind: &'static str,
    /// The tenant namespace; empty for cluster-scoped kinds and host Events.
    pub namespace: String,
    /// The object's name: the tenant's, or the host's for host Events.
    pub name: String,
}

impl Key {
    /// The key of object `namespace/name` of `kind`.
    pub fn new(kind: &'static str, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of `namespace/name` of the kind that syncs objects of type `K`: a kind is named
    /// as its objects' Kubernetes kind, so a kind names another's keys by the object type and
    /// need not import the other kind.
    pub fn of_object<K: k8s_openapi::Resource>(
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        Self::new(K::KIND, namespace, name)
    }

    /// How a person reads it: `Pod default/web`, `Node kwok-node-0`.
    pub fn describe(&self) -> String {
        if self.namespace.is_empty() {
            format!("{} {}", self.kind, self.name)
        } else {
            format!("{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// The object type a kind's syncer watches and writes.
pub trait Object: HostObject + Serialize {}
impl<K: HostObject + Serialize> Object for K {}
