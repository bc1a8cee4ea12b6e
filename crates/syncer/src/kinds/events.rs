//! Host Events about a tenant's copies show up in the tenant, about the tenant's objects and in
//! the tenant's terms (see [`crate::tenant_terms`]): no host namespace, copy name or host node the
//! tenant is not shown, in the message or as the Event's source.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Event as CoreEvent, EventSource, ObjectReference, PersistentVolumeClaim, Pod, Service,
};
use kube::Client;
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use tenantplane_api::SyncPolicySpec;

use crate::error::Result;
use crate::host::Scope;
use crate::key::Key;
use crate::kind_trait::{Kind, scoped_api, shown_watch_config};
use crate::kinds::nodes;
use crate::naming;
use crate::tenant::Tenant;
use crate::tenant_terms::{self, Terms};

/// Host Events about the tenant's copies, shown in the tenant in its own terms.
pub struct Events;

impl Kind for Events {
    const NAME: &'static str = "Event";
    type Object = CoreEvent;
    const SETTING: &'static str = "fromHost.events";

    fn enabled(policy: &SyncPolicySpec) -> bool {
        policy.from_host.events.enabled
    }

    fn tenant_watch(_: &SyncPolicySpec) -> Option<watcher::Config> {
        Some(shown_watch_config())
    }

    /// The tenant's copies change only through this syncer.
    fn tenant_keys(_: &CoreEvent) -> Vec<Key> {
        vec![]
    }

    fn host_scope(policy: &SyncPolicySpec) -> Option<Scope> {
        Self::enabled(policy).then_some(Scope::Namespaced)
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

/// How long an Event whose object is not in the cache yet is looked at again.
const WAIT_FOR_ITS_OBJECT: Duration = Duration::from_secs(30);

/// Was `e` made less than [`WAIT_FOR_ITS_OBJECT`] ago (by the host's clock as the Event says)?
fn young(e: &CoreEvent) -> bool {
    let Some(made) = e.metadata.creation_timestamp.as_ref() else {
        return false;
    };
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(made.0);
    age.as_secs() < WAIT_FOR_ITS_OBJECT.as_secs() as i64
}

async fn converge_event(cx: &Tenant, host_name: &str) -> Result<()> {
    let Some(e) = cx.host_get::<CoreEvent>(true, host_name) else {
        return Ok(());
    };
    let involved = &e.involved_object;
    let name = involved.name.clone().unwrap_or_default();
    let pod = cx.host_get::<Pod>(true, &name);
    let meta = match involved.kind.as_deref() {
        Some("Pod") => pod.as_ref().map(|o| o.metadata.clone()),
        Some("Service") => cx
            .host_get::<Service>(true, &name)
            .map(|o| o.metadata.clone()),
        Some("PersistentVolumeClaim") => cx
            .host_get::<PersistentVolumeClaim>(true, &name)
            .map(|o| o.metadata.clone()),
        _ => None,
    };
    let Some(v) = meta.as_ref().and_then(|m| cx.tr.copy_of(m)) else {
        // The host's watches of Events and of the objects they tell of are separate streams: a
        // young Event may come before its copy is in the cache. Look again shortly, for as long
        // as the Event is young (an Event about something that is no copy is dropped then).
        let copied_kind = matches!(
            involved.kind.as_deref(),
            Some("Pod" | "Service" | "PersistentVolumeClaim")
        );
        if copied_kind && meta.is_none() && young(&e) {
            cx.queue
                .add_after(Key::of::<Events>("", host_name), Duration::from_secs(1));
        }
        return Ok(());
    };
    // (An Event about an earlier copy of the same name waits for nothing.)
    let bound = pod.as_ref().is_some_and(|p| {
        p.spec.as_ref().is_some_and(|s| s.node_name.is_some()) || p.metadata.uid != involved.uid
    });
    if e.reason.as_deref() == Some("Scheduled") && involved.kind.as_deref() == Some("Pod") && !bound
    {
        // The scheduler's Event can come before the binding it tells of: whether the tenant
        // sees the node is known once the copy shows it.
        cx.queue
            .add_after(Key::of::<Events>("", host_name), Duration::from_secs(1));
        return Ok(());
    }
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
    // The nodes the Event may name although no host node watch runs (virtual nodes off).
    let known: Vec<String> = [
        pod.as_ref()
            .and_then(|p| p.spec.as_ref()?.node_name.clone()),
        e.source.as_ref().and_then(|s| s.host.clone()),
        e.reporting_instance.clone(),
    ]
    .into_iter()
    .flatten()
    .collect();
    let terms = Terms {
        host_namespace: &cx.tr.host_namespace,
        namespace: &v.namespace,
        name: &v.name,
        copy: Box::new(|w| tenant_terms::copy_named(cx, w)),
        hidden_node: Box::new(|w| tenant_terms::hidden_node(cx, w, &known)),
        address: Box::new(|ip| tenant_terms::shown_address(cx, ip)),
    };
    let mut wanted = event_up(&e, &about, &tenant_name, &terms, &|n| nodes::shown(cx, n));
    wanted
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(naming::LABEL_SYNCED_FROM.into(), cx.tr.tenant.name.clone());
    write_up(cx, &v.namespace, &tenant_name, &wanted).await
}

/// Make or update the tenant's Event `name` in `namespace` as `wanted` says: its count and
/// message are all that changes of an Event.
async fn write_up(cx: &Tenant, namespace: &str, name: &str, wanted: &CoreEvent) -> Result<()> {
    let current = cx.tenant_get::<CoreEvent>(namespace, name);
    let api: Api<CoreEvent> = Api::namespaced(cx.tenant.clone(), namespace);
    match current {
        None => match api.create(&PostParams::default(), wanted).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            // The tenant namespace went away: nothing to tell.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 403 => Ok(()),
            Err(e) => Err(e.into()),
        },
        Some(c) if c.count != wanted.count || c.message != wanted.message => {
            api.patch(
                name,
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

/// The tenant copy of a host Event about a synced object, in the tenant's `terms`. Its source
/// names a host node (a kubelet's Events) only when `shown` says the tenant sees that node, and
/// never another host machine (a scheduler's instance): its component stands in.
pub fn event_up(
    host: &CoreEvent,
    about: &ObjectReference,
    name: &str,
    terms: &Terms,
    shown: &dyn Fn(&str) -> bool,
) -> CoreEvent {
    let reason = host.reason.as_deref().unwrap_or_default();
    let message = host
        .message
        .as_deref()
        .map(|m| tenant_terms::event_message(reason, m, terms));
    let node = |n: &Option<String>| n.clone().filter(|n| shown(n));
    let source = host.source.as_ref().map(|s| EventSource {
        component: s.component.clone(),
        host: node(&s.host),
    });
    CoreEvent {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: about.namespace.clone(),
            ..Default::default()
        },
        involved_object: about.clone(),
        reason: host.reason.clone(),
        message,
        type_: host.type_.clone(),
        count: host.count,
        first_timestamp: host.first_timestamp.clone(),
        last_timestamp: host.last_timestamp.clone(),
        event_time: host.event_time.clone(),
        source,
        reporting_component: host.reporting_component.clone(),
        // Required of Events with an `eventTime`: the component stands in for a hidden machine.
        reporting_instance: host.reporting_instance.as_ref().map(|i| {
            node(&Some(i.clone()))
                .or_else(|| host.reporting_component.clone().filter(|c| !c.is_empty()))
                .unwrap_or_else(|| "host".into())
        }),
        action: host.action.clone(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_young_event_waits_for_its_object() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        use k8s_openapi::jiff::{SignedDuration, Timestamp};
        let made = |ago: i64| CoreEvent {
            metadata: kube::api::ObjectMeta {
                creation_timestamp: Some(Time(Timestamp::now() - SignedDuration::from_secs(ago))),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(young(&made(1)));
        assert!(!young(&made(31)));
        assert!(!young(&CoreEvent::default()), "no time: not waited for");
    }

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
        let e = event_up(&host, &about, "web.abc", &terms(), &|_| true);
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(e.involved_object.name.as_deref(), Some("web"));
        assert_eq!(e.involved_object.uid.as_deref(), Some("u1"));
        assert_eq!((e.reason.as_deref(), e.count), (Some("Scheduled"), Some(2)));
    }

    fn terms() -> Terms<'static> {
        Terms {
            host_namespace: "team-dev",
            namespace: "default",
            name: "web",
            copy: Box::new(|w| crate::tenant_terms::plain_copy_name(w, "dev")),
            hidden_node: Box::new(|w| w == "pool-b-7"),
            address: Box::new(|_| false),
        }
    }

    fn about() -> ObjectReference {
        ObjectReference {
            kind: Some("Pod".into()),
            name: Some("web".into()),
            namespace: Some("default".into()),
            ..Default::default()
        }
    }

    fn host_event(value: serde_json::Value) -> CoreEvent {
        let mut e = json!({
            "metadata": {"name": "web-x-default-x-dev.1", "namespace": "team-dev"},
            "involvedObject": {"kind": "Pod", "name": "web-x-default-x-dev", "namespace": "team-dev"},
        });
        e.as_object_mut()
            .unwrap()
            .extend(value.as_object().unwrap().clone());
        serde_json::from_value(e).unwrap()
    }

    #[test]
    fn the_scheduled_event_reads_in_tenant_terms() {
        let shown = |n: &str| n == "kwok-node-0";
        let host = host_event(json!({
            "reason": "Scheduled", "type": "Normal",
            "message": "Successfully assigned team-dev/web-x-default-x-dev to kwok-node-0",
            "source": {"component": "default-scheduler"},
            "reportingComponent": "default-scheduler",
            "reportingInstance": "default-scheduler-cp-host-3"
        }));
        let e = event_up(&host, &about(), "web.abc", &terms(), &shown);
        assert_eq!(
            e.message.as_deref(),
            Some("Successfully assigned default/web to kwok-node-0")
        );
        assert_eq!(
            e.reporting_instance.as_deref(),
            Some("default-scheduler"),
            "no host machine's name"
        );
        assert_eq!(e.reporting_component.as_deref(), Some("default-scheduler"));
        let hidden = host_event(json!({
            "reason": "Scheduled",
            "message": "Successfully assigned team-dev/web-x-default-x-dev to pool-b-7"
        }));
        let e = event_up(&hidden, &about(), "web.abc", &terms(), &shown);
        assert_eq!(
            e.message.as_deref(),
            Some(
                "Successfully assigned default/web to a node of the host that this cluster does not show."
            )
        );
    }

    #[test]
    fn a_kubelets_event_names_its_node_only_when_the_tenant_sees_it() {
        let host = host_event(json!({
            "reason": "Pulled", "message": "Container image \"nginx\" already present on machine",
            "source": {"component": "kubelet", "host": "pool-b-7"},
            "reportingComponent": "kubelet", "reportingInstance": "pool-b-7"
        }));
        let e = event_up(&host, &about(), "web.abc", &terms(), &|_| false);
        let source = e.source.unwrap();
        assert_eq!(
            (source.component.as_deref(), source.host),
            (Some("kubelet"), None)
        );
        assert_eq!(e.reporting_instance.as_deref(), Some("kubelet"));
        let e = event_up(&host, &about(), "web.abc", &terms(), &|n| n == "pool-b-7");
        assert_eq!(e.source.unwrap().host.as_deref(), Some("pool-b-7"));
        assert_eq!(e.reporting_instance.as_deref(), Some("pool-b-7"));
    }

    #[test]
    fn scheduling_failures_and_leaking_messages_are_replaced() {
        let failed = host_event(json!({
            "reason": "FailedScheduling", "type": "Warning",
            "message": "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 node(s) didn't match Pod's node affinity/selector."
        }));
        let e = event_up(&failed, &about(), "web.abc", &terms(), &|_| false);
        assert_eq!(
            e.message.as_deref(),
            Some(crate::tenant_terms::WAITING_FOR_ROOM)
        );
        let other = host_event(json!({
            "reason": "FailedMount",
            "message": "secret \"api-x-default-x-payments\" not found in team-dev"
        }));
        let e = event_up(&other, &about(), "web.abc", &terms(), &|_| false);
        assert_eq!(e.message.as_deref(), Some(crate::tenant_terms::NOT_SHOWN));
        let own = host_event(json!({
            "reason": "FailedMount",
            "message": "MountVolume.SetUp failed for volume \"v\" : configmap \"conf-x-default-x-dev\" not found"
        }));
        let e = event_up(&own, &about(), "web.abc", &terms(), &|_| false);
        assert_eq!(
            e.message.as_deref(),
            Some("MountVolume.SetUp failed for volume \"v\" : configmap \"conf\" not found")
        );
    }
}
