//! Services go down with their selector confined to this tenant's pods of the same namespace;
//! the host allocates the cluster IP and the tenant's Service takes it over, so tenant names
//! reach the host copies. The tenant's own `kubernetes` Service gets the address of the tenant
//! API server's host Service. Load-balancer addresses come back.

pub use env::{service_env, tenant_api_env};
use k8s_openapi::api::core::v1::{Endpoints, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use node_ports::{node_ports_up, with_node_ports};
use serde_json::json;
use tenantplane_api::SyncPolicySpec;
use tracing::debug;

use crate::converge::delete_if_present;
use crate::copy::apply_copy;
use crate::error::{Error, Result};
use crate::host::Scope;
use crate::key::Key;
use crate::kind_trait::Kind;
use crate::kinds::endpoints::selectorless;
use crate::naming::{SYNCER_MANAGER, is_tenant_api};
use crate::tell::{self, Review};
use crate::tenant::Tenant;
use crate::translate::Translator;

pub mod address;
pub mod api;
pub mod env;
pub mod node_ports;

use address::{OwnAddress, own_address, squatted};

/// Services, copied down; the host's cluster IP comes back to the tenant Service.
pub struct Services;

impl Kind for Services {
    const NAME: &'static str = "Service";
    type Object = Service;
    const SETTING: &'static str = "toHost.services";

    fn enabled(policy: &SyncPolicySpec) -> bool {
        policy.to_host.services.enabled
    }

    fn selector(policy: &SyncPolicySpec) -> Option<&LabelSelector> {
        policy.to_host.services.selector.as_ref()
    }

    fn tenant_keys(s: &Service) -> Vec<Key> {
        let (ns, n) = (s.namespace().unwrap_or_default(), s.name_any());
        vec![
            Key::of::<Self>(ns.clone(), n.clone()),
            Key::of_object::<Endpoints>(ns, n),
        ]
    }

    fn host_scope(policy: &SyncPolicySpec) -> Option<Scope> {
        crate::copy::copies(policy)
    }

    fn host_api(client: kube::Client, namespace: Option<&str>) -> kube::Api<Service> {
        crate::copy::copies_api(client, namespace)
    }

    fn converge<'a>(cx: &'a Tenant, key: &'a Key) -> futures::future::BoxFuture<'a, Result<()>> {
        Box::pin(converge_service(cx, &key.namespace, &key.name))
    }
}

/// The tenant's `kubernetes` Service stays in the tenant, with the address of the host Service
/// in front of the tenant API server, so `kubernetes.default` reaches the tenant from a synced
/// pod, never the host's API server.
async fn converge_tenant_api(cx: &Tenant, ns: &str, name: &str) -> Result<()> {
    let Some(t) = cx.tenant_get::<Service>(ns, name) else {
        return Ok(());
    };
    let ip = cx.tr.api_ip.clone();
    take_cluster_ip(cx, &t, &ip, Some(vec![ip.clone()]), None).await?;
    api::ensure_api_endpoints(cx).await
}

async fn converge_service(cx: &Tenant, ns: &str, name: &str) -> Result<()> {
    if is_tenant_api(ns, name) {
        return converge_tenant_api(cx, ns, name).await;
    }
    // Whether slices written by hand for it go down follows the Service.
    crate::kinds::endpoints::slices::wake_for_service(cx, ns, name);
    let enabled = Services::enabled(&cx.policy);
    let t = cx
        .tenant_get::<Service>(ns, name)
        .filter(|s| Services::synced(cx, &s.metadata));
    // The one translation of the name in this converge.
    let host_name = cx.tr.host_name(ns, name);
    let h = cx.host_copy::<Service>(&host_name, ns, name);
    let api = cx.host_api::<Service>();
    let Some(t) = t else {
        if let Some(h) = h {
            // The cache may be between our own delete and create of the tenant Service (it
            // takes the host IP that way): ask the tenant before deleting the copy.
            let live = cx.tenant_api::<Service>(ns).get_opt(name).await?;
            if live.is_none() || !enabled {
                delete_if_present(&api, &h, None).await?;
            }
        }
        return Ok(());
    };
    if t.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    tell::enforce(cx, &*t, h.as_deref(), &review(&cx.tr, &t)).await?;
    if let Some(live) = h.as_deref()
        && let Some(ip) = squatted(&cx.tr, live)
    {
        // Made before reserved addresses were kept from tenants: it goes, and is made again
        // with an address the host allocates (its address cannot change in place).
        let _ = tell::tell(cx, &*t, tell::NOT_COPIED, &format!(
            "the host copy held {ip}, an address hosts keep for their own Services; it is made again with one the host allocates"
        )).await;
        delete_if_present(&api, live, None).await?;
        return Ok(());
    }
    // The live copy's address cannot change; a copy that gets its first address (a new one, or
    // an ExternalName Service turned ClusterIP) asks for the tenant's only where the profile
    // honours it.
    let own = own_address(&cx.tr, &t);
    let addressed = h.as_deref().filter(|h| holds_address(h));
    let desired = match (addressed, &own) {
        (Some(h), _) => with_address(service(&cx.tr, &t, &host_name), h),
        (None, OwnAddress::Asked) => with_address(service(&cx.tr, &t, &host_name), &t),
        (None, OwnAddress::NotAsked(_)) => service(&cx.tr, &t, &host_name),
    };
    // Node ports likewise: the tenant's asked for.
    let asked = with_node_ports(desired.clone(), &t);
    // The copy as it would be written: its size is the host's to bear.
    let sized = crate::allow::byte_refusals(&cx.tr.allow, Services::NAME, &asked.metadata, &asked);
    if !sized.is_empty() {
        let review = Review {
            refused: sized,
            dropped: vec![],
        };
        tell::enforce(cx, &*t, h.as_deref(), &review).await?;
    }
    match apply_copy(cx, Services::NAME, ns, name, h.as_deref(), &asked).await {
        // The host holds the tenant's address already, or its range lacks it: the copy takes
        // one of the host's choosing, and the tenant Service is made again with that.
        Err(Error::HostRejected(m)) if addressed.is_none() && m.contains("spec.clusterIP") => {
            debug!(service = %format!("{ns}/{name}"), reason = %m, "the host refused the tenant's address");
            apply_copy(
                cx,
                Services::NAME,
                ns,
                name,
                h.as_deref(),
                &service(&cx.tr, &t, &host_name),
            )
            .await?;
        }
        // Another Service on the host holds a tenant's node port: the host chooses, and the
        // tenant Service takes its choice.
        Err(Error::HostRejected(m)) if m.contains("nodePort") => {
            debug!(service = %format!("{ns}/{name}"), reason = %m, "the host refused the tenant's node port");
            apply_copy(cx, Services::NAME, ns, name, h.as_deref(), &desired).await?;
            let _ = tell::tell(cx, &*t, tell::NOT_COPIED, &format!(
                "the host holds a node port this Service asked for ({m}); it answers on the one the host chose, which the Service now shows"
            )).await;
        }
        other => other?,
    }
    tell::forget(cx, &t.uid().unwrap_or_default());
    let Some(h) = h else {
        // The watch brings the copy with its address.
        return Ok(());
    };
    show_up(cx, ns, name, &t, &h, &own).await
}

/// What the tenant's Service `t` (`ns/name`) takes from its host copy `h`: its cluster IP, the
/// node ports the copy answers on, and the load balancer's addresses.
async fn show_up(
    cx: &Tenant,
    ns: &str,
    name: &str,
    t: &Service,
    h: &Service,
    own: &OwnAddress,
) -> Result<()> {
    // The tenant's Service takes its host copy's cluster IP.
    let h_ip = h.spec.as_ref().and_then(|s| s.cluster_ip.clone());
    if let Some(h_ip) = h_ip.filter(|ip| ip != "None" && !ip.is_empty()) {
        let h_ips = h.spec.as_ref().and_then(|s| s.cluster_ips.clone());
        let note = match own {
            OwnAddress::NotAsked(Some(why)) => Some(why.as_str()),
            _ => None,
        };
        if take_cluster_ip(cx, t, &h_ip, h_ips, note).await? {
            return Ok(());
        }
    }
    // The tenant Service shows the node ports its copy answers on.
    if let Some(ports) = node_ports_up(t, h) {
        cx.tenant_api::<Service>(ns)
            .patch(
                name,
                &PatchParams {
                    field_manager: Some(SYNCER_MANAGER.into()),
                    ..Default::default()
                },
                &Patch::Merge(json!({"spec": {"ports": ports}})),
            )
            .await?;
    }
    // Load balancer addresses come back.
    let h_lb = h.status.as_ref().and_then(|s| s.load_balancer.clone());
    let t_lb = t.status.as_ref().and_then(|s| s.load_balancer.clone());
    if h_lb.as_ref().is_some_and(|lb| lb.ingress.is_some()) && h_lb != t_lb {
        cx.tenant_api::<Service>(ns)
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"loadBalancer": h_lb}})),
            )
            .await?;
    }
    Ok(())
}

/// Give tenant Service `t` the cluster IP `ip` (delete and create: the field is immutable), and
/// tell the Service made again `note` (why its own address was not kept), if any.
/// `false` when there was nothing to do: it has the IP, is headless, or someone holds it with
/// a finalizer.
async fn take_cluster_ip(
    cx: &Tenant,
    t: &Service,
    ip: &str,
    ips: Option<Vec<String>>,
    note: Option<&str>,
) -> Result<bool> {
    let (ns, name) = (t.namespace().unwrap_or_default(), t.name_any());
    let t_ip = t.spec.as_ref().and_then(|s| s.cluster_ip.as_deref());
    if t_ip == Some("None")
        || t_ip == Some(ip)
        || t.metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| !f.is_empty())
    {
        return Ok(false);
    }
    if !crate::allow::in_cidrs(std::slice::from_ref(&cx.tr.service_cidr), ip) {
        // The tenant would refuse it: deleting the Service to try would only lose it.
        return Err(Error::ServiceIpNotAdopted {
            ip: ip.to_string(),
            message: format!(
                "it is outside the tenant's Service range {}; the tenant Service keeps its own address",
                cx.tr.service_cidr
            ),
        });
    }
    let tenant_api = cx.tenant_api::<Service>(&ns);
    let copy = with_cluster_ip(t, Some(ip.to_string()), ips);
    let pp = PostParams {
        field_manager: Some(SYNCER_MANAGER.into()),
        ..Default::default()
    };
    // A selector-less Service's Endpoints are written by a person; the tenant's endpoints
    // controller deletes them when it sees the Service go.
    let endpoints = if selectorless(t) {
        cx.tenant_api::<Endpoints>(&ns).get_opt(&name).await?
    } else {
        None
    };
    if !delete_if_present(&tenant_api, t, None).await? {
        // Deleted or replaced by someone else meanwhile: never bring it back.
        return Ok(true);
    }
    let made = match tenant_api.create(&pp, &copy).await {
        Ok(made) => made,
        Err(e) => {
            // Never leave the tenant without its Service: put it back as it was, with an
            // address of the tenant's choosing, and say why the host's was refused.
            tenant_api
                .create(&pp, &with_cluster_ip(t, None, None))
                .await?;
            return Err(Error::ServiceIpNotAdopted {
                ip: ip.to_string(),
                message: e.to_string(),
            });
        }
    };
    if let Some(note) = note {
        let _ = tell::tell(cx, &made, tell::NOT_COPIED, note).await;
    }
    debug!(service = %format!("{ns}/{name}"), ip = %ip, "tenant Service recreated with the host's cluster IP");
    if let Some(endpoints) = endpoints {
        keep_endpoints(cx, &endpoints).await?;
    }
    Ok(true)
}

/// Does Service `s` hold a cluster IP (not headless, not ExternalName)?
fn holds_address(s: &Service) -> bool {
    s.spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .is_some_and(|ip| !ip.is_empty() && ip != "None")
}

/// How long, after a selector-less Service is made again, its Endpoints are watched for the
/// tenant endpoints controller's delete, and how often.
const KEEP_ENDPOINTS_CHECKS: u32 = 20;
const KEEP_ENDPOINTS_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// Put Endpoints `saved` back whenever they are missing, for a few seconds after their Service
/// was deleted and made again (the tenant's endpoints controller deletes the Endpoints of a
/// Service it saw go, once it gets to that key).
async fn keep_endpoints(cx: &Tenant, saved: &Endpoints) -> Result<()> {
    let (ns, name) = (saved.namespace().unwrap_or_default(), saved.name_any());
    let api = cx.tenant_api::<Endpoints>(&ns);
    let again = Endpoints {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns.clone()),
            labels: saved.metadata.labels.clone(),
            annotations: saved.metadata.annotations.clone(),
            ..Default::default()
        },
        subsets: saved.subsets.clone(),
    };
    let pp = PostParams {
        field_manager: Some(SYNCER_MANAGER.into()),
        ..Default::default()
    };
    for _ in 0..KEEP_ENDPOINTS_CHECKS {
        if api.get_opt(&name).await?.is_none() {
            match api.create(&pp, &again).await {
                Ok(_) => debug!(endpoints = %format!("{ns}/{name}"), "Endpoints put back"),
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        tokio::time::sleep(KEEP_ENDPOINTS_EVERY).await;
    }
    Ok(())
}

/// Tenant Service `t` as it is made again with cluster IP `ip` (`None`: of the tenant's choosing).
pub fn with_cluster_ip(t: &Service, ip: Option<String>, ips: Option<Vec<String>>) -> Service {
    let mut copy = t.clone();
    copy.metadata = ObjectMeta {
        name: t.metadata.name.clone(),
        namespace: t.metadata.namespace.clone(),
        labels: t.metadata.labels.clone(),
        annotations: t.metadata.annotations.clone(),
        owner_references: t.metadata.owner_references.clone(),
        ..Default::default()
    };
    if let Some(spec) = copy.spec.as_mut() {
        spec.cluster_ip = ip;
        spec.cluster_ips = ips;
        // Node ports are the host's business; the tenant keeps asking for its own.
        for p in spec.ports.iter_mut().flatten() {
            p.node_port = None;
        }
        spec.health_check_node_port = None;
    }
    copy.status = None;
    copy
}

/// Host copy `copy` asking for the cluster IPs `of` has (the tenant Service, when the copy is
/// first made: so the tenant's address is the host's too, and the tenant Service is never made
/// again; the live copy after that, whose address cannot change). Headless and ExternalName
/// Services have none.
pub fn with_address(mut copy: Service, of: &Service) -> Service {
    let from = of.spec.as_ref();
    let ip = from
        .and_then(|s| s.cluster_ip.clone())
        .filter(|ip| !ip.is_empty() && ip != "None");
    if let (Some(spec), Some(ip)) = (copy.spec.as_mut(), ip) {
        spec.cluster_ip = Some(ip);
        spec.cluster_ips = from.and_then(|s| s.cluster_ips.clone());
    }
    copy
}

/// What the host copy of a tenant Service leaves out, and why it may have none: its type,
/// external name and external IPs under the profile's `allow`, and a cluster IP of its own
/// choosing that the host does not give.
pub fn review(tr: &Translator, svc: &Service) -> Review {
    let mut dropped = tr.annotations("Service", &svc.metadata).1;
    if let OwnAddress::NotAsked(Some(why)) = own_address(tr, svc) {
        dropped.push(why);
    }
    let spec = svc.spec.clone().unwrap_or_default();
    if spec.load_balancer_ip.is_some() {
        dropped.push(
            "spec.loadBalancerIP is left out (an address of the host's balancers is the host's to give)"
                .into(),
        );
    }
    Review {
        refused: crate::allow::service_refusals(&tr.allow, &spec),
        dropped,
    }
}

/// The host copy of a tenant Service: same ports and type, the selector confined to this
/// tenant's pods of the same namespace, and no cluster IP of its own choosing ([`with_address`]
/// asks for the tenant's; where the host refuses it, the host allocates one and the tenant
/// Service takes that over).
/// `host_name` is its name (see [`Translator::host_name`]).
pub fn service(tr: &Translator, svc: &Service, host_name: &str) -> Service {
    let ns = svc.namespace().unwrap_or_default();
    let spec = svc.spec.clone().unwrap_or_default();
    let headless = spec.cluster_ip.as_deref() == Some("None");
    let ports = spec.ports.map(|ports| {
        ports
            .into_iter()
            .map(|p| ServicePort {
                node_port: None,
                ..p
            })
            .collect()
    });
    Service {
        metadata: tr.host_meta("Service", &svc.metadata, host_name),
        spec: Some(ServiceSpec {
            type_: spec.type_.clone(),
            ports,
            selector: spec.selector.as_ref().map(|s| tr.host_selector(&ns, s)),
            cluster_ip: headless.then(|| "None".to_string()),
            external_name: spec.external_name.clone(),
            session_affinity: spec.session_affinity.clone(),
            publish_not_ready_addresses: spec.publish_not_ready_addresses,
            ip_families: spec.ip_families.clone(),
            ip_family_policy: spec.ip_family_policy.clone(),
            internal_traffic_policy: spec.internal_traffic_policy.clone(),
            external_traffic_policy: spec.external_traffic_policy.clone(),
            // Who may reach a balancer: leaving it out would open the balancer to everyone.
            load_balancer_source_ranges: spec.load_balancer_source_ranges.clone(),
            load_balancer_class: spec.load_balancer_class.clone(),
            allocate_load_balancer_node_ports: spec.allocate_load_balancer_node_ports,
            // Only addresses the profile allows (a Service with others is refused).
            external_ips: spec.external_ips.clone(),
            session_affinity_config: spec.session_affinity_config.clone(),
            traffic_distribution: spec.traffic_distribution,
            ..Default::default()
        }),
        status: None,
    }
}

/// A port's protocol, TCP when it names none (as the API server defaults it).
fn protocol(p: &ServicePort) -> String {
    p.protocol.clone().unwrap_or_else(|| "TCP".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::naming;
    use crate::translate::tests::{host_name_of, translator};

    /// The host copy of `svc`, named as its converge names it.
    fn copy_of(svc: &Service) -> Service {
        let tr = translator();
        service(&tr, svc, &host_name_of(&tr, &svc.metadata))
    }

    #[test]
    fn a_copy_asks_for_the_tenants_address_but_never_for_a_headless_one() {
        let svc = |ip: &str| -> Service {
            serde_json::from_value(json!({
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"clusterIP": ip, "clusterIPs": [ip], "ports": [{"port": 80}]}
            }))
            .unwrap()
        };
        let t = svc("10.96.7.7");
        let copy = with_address(copy_of(&t), &t);
        let spec = copy.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.7.7"));
        assert_eq!(spec.cluster_ips.unwrap(), ["10.96.7.7"]);
        let headless = svc("None");
        let copy = with_address(copy_of(&headless), &headless);
        assert_eq!(copy.spec.unwrap().cluster_ip.as_deref(), Some("None"));
        // Not allocated yet: nothing to ask for.
        let none: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default"}, "spec": {}
        }))
        .unwrap();
        let copy = with_address(copy_of(&none), &none);
        assert_eq!(copy.spec.unwrap().cluster_ip, None);
    }

    #[test]
    fn a_service_selects_only_its_namespace_copies() {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "s1"},
            "spec": {"selector": {"app": "web"}, "clusterIP": "10.0.0.9",
                     "type": "NodePort",
                     "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}
        }))
        .unwrap();
        let host = copy_of(&svc);
        let spec = host.spec.unwrap();
        assert_eq!(spec.cluster_ip, None, "the host allocates it");
        assert_eq!(spec.ports.unwrap()[0].node_port, None);
        let selector = spec.selector.unwrap();
        assert_eq!(selector["dev.tenant.tenantplane.io/app"], "web");
        assert_eq!(selector[naming::LABEL_SYNCED_FROM], "dev");
        assert_eq!(selector[naming::LABEL_VIRTUAL_NAMESPACE], "default");
        let env = service_env(&svc);
        let find = |n: &str| env.iter().find(|e| e.name == n).unwrap().value.clone();
        assert_eq!(find("WEB_SERVICE_HOST").as_deref(), Some("10.0.0.9"));
        assert_eq!(
            find("WEB_PORT_80_TCP").as_deref(),
            Some("tcp://10.0.0.9:80")
        );
        assert_eq!(
            Services::tenant_keys(&svc),
            [
                Key::new("Service", "default", "web"),
                Key::new("Endpoints", "default", "web")
            ]
        );
    }

    #[test]
    fn a_service_made_again_keeps_what_the_tenant_wrote_but_its_address() {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "s1",
                         "resourceVersion": "5", "labels": {"a": "b"}},
            "spec": {"clusterIP": "10.0.0.9", "ports": [{"port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {}}
        }))
        .unwrap();
        let again = with_cluster_ip(&svc, Some("10.96.1.1".into()), None);
        assert_eq!(again.metadata.uid, None);
        assert_eq!(again.metadata.resource_version, None);
        assert_eq!(again.metadata.labels.unwrap()["a"], "b");
        let spec = again.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.1.1"));
        assert_eq!(spec.ports.unwrap()[0].node_port, None);
        assert!(again.status.is_none());
    }

    /// Moved from `address`'s tests: the review says what `own_address` decided.
    #[test]
    fn a_reserved_address_is_told_and_an_allocated_one_is_not() {
        use super::address::tests::at;
        let tr = translator();
        // The copy never asks for a reserved address, even the first time.
        let t = at("10.96.0.10", Some("kubectl"));
        assert!(
            review(&tr, &t)
                .dropped
                .iter()
                .any(|d| d.contains("10.96.0.10"))
        );
        assert!(review(&tr, &at("10.96.7.7", None)).dropped.is_empty());
    }
}
