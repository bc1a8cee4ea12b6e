//! Snapshots of tenants' datastores: the agent in each control-plane pod ([`agent`]), the copy it
//! makes ([`copy`]), the operator's client for it ([`agent_client`]), the S3 stores
//! ([`store`]), and the two controllers: SnapshotStores checked ([`stores`]) and
//! TenantSnapshots taken and deleted ([`snapshots`]).
//!
//! The bytes go agent → operator → store, streamed: the store's credentials stay in the
//! operator's namespace, and neither side holds a whole snapshot in memory.

pub mod agent;
pub mod agent_client;
pub mod copy;
pub mod crypt;
mod error;
pub mod restore;
pub mod schedule;
pub mod snapshots;
pub mod store;
pub mod stores;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};
use tenantplane_api::SnapshotStore;

pub use error::Error;
pub(crate) use error::api;

/// The finalizer that deletes a TenantSnapshot's stored objects before the object goes.
pub const FINALIZER: &str = "tenantplane.io/snapshot";

/// How the snapshot controllers run.
#[derive(Clone, Debug, Default)]
pub struct SnapshotOptions {
    /// Where the stores' credentials Secrets are: the operator's namespace. Without one, stores
    /// are reported unusable and snapshots fail, saying so.
    pub secrets_namespace: Option<String>,
}

/// Write a snapshot resource's whole status by server-side apply (what this manager no longer
/// sets goes), or say why it could not.
pub(crate) async fn apply_status<K>(
    api: &Api<K>,
    name: &str,
    status: &impl serde::Serialize,
) -> Result<(), Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let kind = K::kind(&());
    api.patch_status(
        name,
        &kube::api::PatchParams::apply(crate::names::FIELD_MANAGER).force(),
        &kube::api::Patch::Apply(serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": kind,
            "status": status,
        })),
    )
    .await
    .map(|_| ())
    .map_err(error::api(format!("writing {kind} {name}'s status")))
}

/// A store, resolved by name (or the default one) and connected with its Secret; or why not.
pub async fn open_store(
    client: &Client,
    options: &SnapshotOptions,
    name: Option<&str>,
) -> Result<(SnapshotStore, store::Store), Error> {
    let stores: Api<SnapshotStore> = Api::all(client.clone());
    let found = match name {
        Some(name) => stores
            .get_opt(name)
            .await
            .map_err(error::api(format!("reading SnapshotStore {name}")))?
            .ok_or_else(|| format!("SnapshotStore {name} does not exist"))?,
        None => {
            let all = stores
                .list(&Default::default())
                .await
                .map_err(error::api("listing SnapshotStores"))?;
            let mut defaults: Vec<SnapshotStore> =
                all.items.into_iter().filter(|s| s.spec.default).collect();
            match defaults.len() {
                0 => {
                    return Err(Error::Step(
                        "no SnapshotStore is marked default: name one in spec.storeRef, or set default: true on one".into(),
                    ));
                }
                1 => defaults.remove(0),
                _ => {
                    let names: Vec<String> = defaults.iter().map(|s| s.name_any()).collect();
                    return Err(Error::Step(format!(
                        "SnapshotStores {} are all marked default: keep default: true on one",
                        names.join(", ")
                    )));
                }
            }
        }
    };
    let secret = credentials(client, options, &found).await?;
    let mut connected =
        store::Store::connect(&found.spec, &secret).map_err(|source| Error::InStore {
            store: found.name_any(),
            source,
        })?;
    if let Some(encryption) = &found.spec.encryption {
        let name = &encryption.key_secret_ref.name;
        let secret = read_secret(client, options, name).await?;
        let text = secret
            .data
            .as_ref()
            .and_then(|d| d.get(crypt::KEY))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .ok_or_else(|| format!("Secret {name} has no key {:?}", crypt::KEY))?;
        connected.key =
            Some(
                crypt::SnapshotKey::from_base64(&text).map_err(|source| Error::Key {
                    store: found.name_any(),
                    secret: name.clone(),
                    source,
                })?,
            );
    }
    Ok((found, connected))
}

/// A store's credentials Secret, from the operator's namespace.
pub async fn credentials(
    client: &Client,
    options: &SnapshotOptions,
    found: &SnapshotStore,
) -> Result<Secret, Error> {
    read_secret(client, options, &found.spec.credentials_secret_ref.name)
        .await
        .map_err(|e| Error::Credentials(Box::new(e)))
}

/// A Secret of the operator's namespace.
async fn read_secret(
    client: &Client,
    options: &SnapshotOptions,
    name: &str,
) -> Result<Secret, Error> {
    let Some(ns) = options.secrets_namespace.as_deref() else {
        return Err(Error::Step(
            "the operator does not know its namespace (--operator-namespace, or POD_NAMESPACE), where store credentials and keys are kept".into(),
        ));
    };
    Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(error::api(format!("reading Secret {ns}/{name}")))?
        .ok_or_else(|| Error::SecretMissing {
            namespace: ns.to_string(),
            name: name.to_string(),
        })
}
