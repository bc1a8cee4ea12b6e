//! Host Events about a tenant's copies show up in the tenant, about the tenant's objects.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Event as CoreEvent, ObjectReference, PersistentVolumeClaim, Pod, Service,
};
use kube::Client;
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use tenantplane_api::SyncPolicySpec;

use crate::error::Result;
use crate::host::Scope;
use crate::kind::{Key, Kind, scoped_api, shown_watch_config};
use crate::naming;
use crate::tenant::Tenant;

pub struct Events;

impl Kind for Events {
    const NAME: &'static str = "Event";
    type Object = CoreEvent;

    fn tenant_watch(_: &SyncPolicySpec) -> Option<watcher::Config> {
        Some(shown_watch_config())
    }

    /// The tenant's copies change only through this syncer.
    fn tenant_keys(_: &CoreEvent) -> Vec<Key> {
        vec![]
    }

    fn host_scope(policy: &SyncPolicySpec) -> Option<Scope> {
        policy.from_host.events.enabled.then_some(Scope::Namespaced)
    }

    fn host_api(client: Client, namespace: Option<&str>) -> Api<CoreEvent> {
        scoped_api(client, namespace)
    }

    fn host_keys(e: &CoreEvent, _: &str) -> Vec<Key> {
        vec![Key::of::<Self>("", e.name_any())]
    }

    fn converge<'a>(cx: &'a Tenant, key: &'a Key) -> futures::future::BoxFuture<'a, Result<()>> {
        Box::pin(converge_event(cx, &key.name))
    }

    fn everything(cx: &Tenant) -> Vec<Key> {
        cx.host_slice::<CoreEvent>()
            .iter()
            .map(|e| Key::of::<Self>("", e.name_any()))
            .collect()
    }
}

async fn converge_event(cx: &Tenant, host_name: &str) -> Result<()> {
    let Some(e) = cx.host_get::<CoreEvent>(true, host_name) else {
        return Ok(());
    };
    let involved = &e.involved_object;
    let name = involved.name.clone().unwrap_or_default();
    let meta = match involved.kind.as_deref() {
        Some("Pod") => cx.host_get::<Pod>(true, &name).map(|o| o.metadata.clone()),
        Some("Service") => cx
            .host_get::<Service>(true, &name)
            .map(|o| o.metadata.clone()),
        Some("PersistentVolumeClaim") => cx
            .host_get::<PersistentVolumeClaim>(true, &name)
            .map(|o| o.metadata.clone()),
        _ => None,
    };
    let Some(v) = meta.and_then(|m| cx.tr.copy_of(&m)) else {
        return Ok(());
    };
    let about = ObjectReference {
        api_version: involved.api_version.clone(),
        kind: involved.kind.clone(),
        name: Some(v.name.clone()),
        namespace: Some(v.namespace.clone()),
        uid: Some(v.uid.clone()),
        field_path: involved.field_path.clone(),
        resource_version: None,
    };
    let tenant_name = format!(
        "{}.{}",
        v.name.chars().take(200).collect::<String>(),
        &naming::label_value(&format!("{host_name}/"))
    );
    let mut wanted = event_up(&e, &about, &tenant_name);
    wanted
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(naming::LABEL_SYNCED_FROM.into(), cx.tr.tenant.name.clone());
    let current = cx.tenant_get::<CoreEvent>(&v.namespace, &tenant_name);
    let api: Api<CoreEvent> = Api::namespaced(cx.tenant.clone(), &v.namespace);
    match current {
        None => match api.create(&PostParams::default(), &wanted).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            // The tenant namespace went away: nothing to tell.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 403 => Ok(()),
            Err(e) => Err(e.into()),
        },
        Some(c) if c.count != wanted.count || c.message != wanted.message => {
            api.patch(
                &tenant_name,
                &PatchParams::default(),
                &Patch::Merge(json!({
                    "count": wanted.count, "message": wanted.message,
                    "lastTimestamp": wanted.last_timestamp,
                })),
            )
            .await?;
            Ok(())
        }
        Some(_) => Ok(()),
    }
}

/// The tenant copy of a host Event about a synced object.
pub fn event_up(host: &CoreEvent, about: &ObjectReference, name: &str) -> CoreEvent {
    CoreEvent {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: about.namespace.clone(),
            ..Default::default()
        },
        involved_object: about.clone(),
        reason: host.reason.clone(),
        message: host.message.clone(),
        type_: host.type_.clone(),
        count: host.count,
        first_timestamp: host.first_timestamp.clone(),
        last_timestamp: host.last_timestamp.clone(),
        event_time: host.event_time.clone(),
        source: host.source.clone(),
        reporting_component: host.reporting_component.clone(),
        reporting_instance: host.reporting_instance.clone(),
        action: host.action.clone(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_event_is_told_about_the_tenant_object() {
        let host: CoreEvent = serde_json::from_value(json!({
            "metadata": {"name": "web-x-default-x-dev.1", "namespace": "team-dev"},
            "involvedObject": {"kind": "Pod", "name": "web-x-default-x-dev", "namespace": "team-dev"},
            "reason": "Scheduled", "message": "assigned to n1", "count": 2, "type": "Normal"
        }))
        .unwrap();
        let about = ObjectReference {
            kind: Some("Pod".into()),
            name: Some("web".into()),
            namespace: Some("default".into()),
            uid: Some("u1".into()),
            ..Default::default()
        };
        let e = event_up(&host, &about, "web.abc");
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(e.involved_object.name.as_deref(), Some("web"));
        assert_eq!(e.involved_object.uid.as_deref(), Some("u1"));
        assert_eq!((e.reason.as_deref(), e.count), (Some("Scheduled"), Some(2)));
    }
}
