//! The tenant's cluster DNS, kept in the tenant by its syncer through the tenant API (k3s's
//! bundled CoreDNS is disabled: its manifest fails Pod Security `restricted` on the host, and it
//! takes the service range's `.10`, which is the host's own DNS address on many clusters).
//!
//! A CoreDNS Deployment that passes `restricted` (non-root, an unprivileged port, every
//! capability dropped, the runtime's default seccomp profile, a read-only root), a `kube-dns`
//! Service whose address the host allocates (the syncer gives the tenant's Service its copy's
//! address), and a Corefile that serves the tenant's zone from the tenant API and forwards the
//! rest to the host's DNS. The syncer points synced pods at that Service.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::Api;
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::converge::{self, Target};
use crate::error::{Error, Result};
use crate::naming::{LABEL_SYNCED_FROM, SYNCER_MANAGER};

/// The CoreDNS image: the one k3s ships, from the same organisation as the k3s image.
pub const COREDNS_IMAGE: &str = "rancher/mirrored-coredns-coredns:1.12.3";
/// Where the tenant's DNS runs and what its Service is called, as in every Kubernetes cluster.
pub const DNS_NAMESPACE: &str = "kube-system";
/// The tenant DNS's Service name, also its pods' `k8s-app` label.
pub const DNS_SERVICE: &str = "kube-dns";
/// The port CoreDNS listens on in its pod: unprivileged, so it runs without any capability.
const DNS_PORT: i32 = 1053;
const NAME: &str = "coredns";

/// The Corefile: the tenant's zone from the tenant API, the rest from `upstream` (the host's DNS
/// addresses; the pod's own resolver when the host has none known). Reverse lookups are the
/// tenant's alone, with no fallthrough: the tenant's Service range is the host's, so the host's
/// DNS would name the host's Services, other tenants' copies and their namespaces (a reverse
/// lookup of an address the tenant does not serve is NXDOMAIN, public ones included).
pub fn corefile(upstream: &[String]) -> String {
    let forward = if upstream.is_empty() {
        "/etc/resolv.conf".to_string()
    } else {
        upstream.join(" ")
    };
    format!(
        ".:{DNS_PORT} {{
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        pods insecure
        ttl 30
    }}
    prometheus :9153
    forward . {forward}
    cache 30
    loop
    reload
    loadbalance
}}
"
    )
}

fn labels(tenant: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("k8s-app".to_string(), DNS_SERVICE.to_string()),
        (LABEL_SYNCED_FROM.to_string(), tenant.to_string()),
    ])
}

fn object<K: DeserializeOwned>(value: serde_json::Value) -> Result<K> {
    serde_json::from_value(value).map_err(|source| Error::Serialize {
        kind: "a DNS object".into(),
        source,
    })
}

/// Everything the tenant's DNS is made of, for tenant `tenant` whose host DNS is `upstream`.
pub struct DnsObjects {
    /// The identity CoreDNS runs as.
    pub service_account: ServiceAccount,
    /// What CoreDNS may read: Services, their endpoints, pods and namespaces.
    pub cluster_role: ClusterRole,
    /// Grants the ClusterRole to the ServiceAccount.
    pub cluster_role_binding: ClusterRoleBinding,
    /// The Corefile: `cluster.local` from the tenant's objects, every other name from the host's
    /// DNS.
    pub config_map: ConfigMap,
    /// CoreDNS itself.
    pub deployment: Deployment,
    /// The `kube-dns` Service the tenant's pods name as their DNS server.
    pub service: Service,
}

/// The DNS objects of tenant `tenant`, forwarding other names to the host DNS servers
/// `upstream`.
pub fn dns_objects(tenant: &str, upstream: &[String]) -> Result<DnsObjects> {
    let labels = labels(tenant);
    let meta = |name: &str| json!({"name": name, "namespace": DNS_NAMESPACE, "labels": labels});
    Ok(DnsObjects {
        service_account: object(json!({"metadata": meta(NAME)}))?,
        cluster_role: object(json!({
            "metadata": {"name": "system:coredns", "labels": labels},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                 "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                 "verbs": ["list", "watch"]}
            ]
        }))?,
        cluster_role_binding: object(json!({
            "metadata": {"name": "system:coredns", "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "system:coredns"},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": DNS_NAMESPACE}]
        }))?,
        config_map: object(json!({
            "metadata": meta(NAME),
            "data": {"Corefile": corefile(upstream)}
        }))?,
        deployment: object(json!({
            "metadata": meta(NAME),
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"k8s-app": DNS_SERVICE}},
                "template": {
                    "metadata": {"labels": {"k8s-app": DNS_SERVICE}},
                    "spec": {
                        "serviceAccountName": NAME,
                        "priorityClassName": "system-cluster-critical",
                        // The host's resolver: the Corefile forwards there; never itself.
                        "dnsPolicy": "Default",
                        "securityContext": {
                            "runAsNonRoot": true,
                            "runAsUser": 65532,
                            "runAsGroup": 65532,
                            "seccompProfile": {"type": "RuntimeDefault"}
                        },
                        "containers": [{
                            "name": NAME,
                            "image": COREDNS_IMAGE,
                            "args": ["-conf", "/etc/coredns/Corefile"],
                            "ports": [
                                {"name": "dns", "containerPort": DNS_PORT, "protocol": "UDP"},
                                {"name": "dns-tcp", "containerPort": DNS_PORT, "protocol": "TCP"},
                                {"name": "metrics", "containerPort": 9153, "protocol": "TCP"}
                            ],
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "70Mi"},
                                "limits": {"memory": "170Mi"}
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": false,
                                "readOnlyRootFilesystem": true,
                                "capabilities": {"drop": ["ALL"]}
                            },
                            "livenessProbe": {
                                "httpGet": {"path": "/health", "port": 8080},
                                "initialDelaySeconds": 60, "periodSeconds": 10,
                                "failureThreshold": 3
                            },
                            "readinessProbe": {
                                "httpGet": {"path": "/ready", "port": 8181},
                                "periodSeconds": 2
                            },
                            "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns",
                                              "readOnly": true}]
                        }],
                        "volumes": [{"name": "config", "configMap": {
                            "name": NAME, "items": [{"key": "Corefile", "path": "Corefile"}]
                        }}]
                    }
                }
            }
        }))?,
        // No fixed address: the host allocates its copy's, and the tenant's Service takes it.
        service: object(json!({
            "metadata": meta(DNS_SERVICE),
            "spec": {
                "selector": {"k8s-app": DNS_SERVICE},
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": DNS_PORT, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": DNS_PORT, "protocol": "TCP"},
                    {"name": "metrics", "port": 9153, "targetPort": 9153, "protocol": "TCP"}
                ]
            }
        }))?,
    })
}

pub(crate) async fn ensure<K>(api: Api<K>, desired: &K) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Serialize + DeserializeOwned,
{
    let name = desired.meta().name.clone().unwrap_or_default();
    let live = api.get_opt(&name).await?;
    converge::converge(&api, SYNCER_MANAGER, live.as_ref(), desired, Target::Any).await?;
    Ok(())
}

/// Make the tenant's DNS exist as [`dns_objects`] says: one read per object, a write only where
/// the tenant's object differs.
pub async fn ensure_dns(tenant: &Client, name: &str, upstream: &[String]) -> Result<()> {
    let o = dns_objects(name, upstream)?;
    let ns = |c: &Client| (c.clone(), DNS_NAMESPACE);
    let (c, n) = ns(tenant);
    ensure(
        Api::<ServiceAccount>::namespaced(c.clone(), n),
        &o.service_account,
    )
    .await?;
    ensure(Api::<ClusterRole>::all(c.clone()), &o.cluster_role).await?;
    ensure(
        Api::<ClusterRoleBinding>::all(c.clone()),
        &o.cluster_role_binding,
    )
    .await?;
    ensure(Api::<ConfigMap>::namespaced(c.clone(), n), &o.config_map).await?;
    ensure(Api::<Service>::namespaced(c.clone(), n), &o.service).await?;
    ensure(Api::<Deployment>::namespaced(c, n), &o.deployment).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_corefile_serves_the_tenant_zone_and_forwards_to_the_host() {
        let with_host = corefile(&["10.96.0.10".into()]);
        assert!(with_host.starts_with(".:1053 {"));
        assert!(with_host.contains("kubernetes cluster.local in-addr.arpa ip6.arpa"));
        assert!(with_host.contains("forward . 10.96.0.10\n"));
        assert!(corefile(&[]).contains("forward . /etc/resolv.conf\n"));
    }

    #[test]
    fn reverse_lookups_never_fall_through_to_the_host() {
        // The host's DNS names every address of the shared Service range: asked, it would tell
        // a tenant the host's Services and other tenants' copies.
        let corefile = corefile(&["10.96.0.10".into()]);
        assert!(!corefile.contains("fallthrough"), "{corefile}");
        let zones = corefile
            .lines()
            .find(|l| l.trim_start().starts_with("kubernetes "))
            .unwrap();
        assert!(zones.contains("in-addr.arpa") && zones.contains("ip6.arpa"));
    }

    #[test]
    fn coredns_passes_pod_security_restricted_and_takes_no_fixed_address() {
        let o = dns_objects("dev", &[]).unwrap();
        let pod = o.deployment.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.dns_policy.as_deref(), Some("Default"), "never itself");
        let psc = pod.security_context.unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(
            psc.seccomp_profile.unwrap().type_,
            "RuntimeDefault".to_string()
        );
        let c = &pod.containers[0];
        let sc = c.security_context.clone().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        let caps = sc.capabilities.unwrap();
        assert_eq!(caps.drop.unwrap(), vec!["ALL".to_string()]);
        assert!(caps.add.is_none());
        assert!(
            c.ports.iter().flatten().all(|p| p.container_port >= 1024),
            "an unprivileged port"
        );
        let svc = o.service.spec.unwrap();
        assert_eq!(svc.cluster_ip, None);
        assert_eq!(svc.ports.unwrap()[0].port, 53);
        assert_eq!(o.service.metadata.name.as_deref(), Some("kube-dns"));
    }
}
