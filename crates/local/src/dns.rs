//! The local runtime's cluster DNS: for tests and `tenantplane dev` only, it stands in for the
//! kubelet that would run a tenant's CoreDNS pod. When the syncer's host copy of that pod (the
//! operator's Deployment `kube-system/coredns` in the tenant) is scheduled, the runtime runs the
//! test control plane's `coredns` with the copy's own Corefile and service-account token, read
//! from the host objects the copy mounts, as a kubelet would.
//!
//! A pod has a network namespace of its own and a kubelet mounts its token; here both are
//! simulated, so the Corefile is changed in exactly these places (see [`local_corefile`]): it
//! listens on free loopback ports instead of the pod's, it reaches the tenant API through a
//! kubeconfig carrying the pod's token instead of the in-cluster address, and it forwards what
//! is not the tenant's to a loopback port where nothing answers (so nothing leaves the machine).
//! Every other line, and every plugin it names, is run as the operator wrote it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, PodSpec, Secret};
use kube::{Api, Client, ResourceExt};
use tenantplane_syncer::addons::COREDNS_IMAGE;

use tenantplane_testenv::Binaries;
use tenantplane_testenv::process::{self, Handle, free_port};
use tenantplane_testenv::{Error, Result, kubeconfig};

/// Where a kubelet mounts a pod's service-account token.
const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// One running CoreDNS, for the host pod it stands for.
pub(crate) struct DnsServer {
    pub namespace: String,
    pub tenant: String,
    /// Where it answers (UDP and TCP).
    pub address: SocketAddr,
    pub handle: Handle,
    /// Its output.
    pub log: PathBuf,
}

/// Is this the host copy of a tenant's CoreDNS pod?
pub(crate) fn is_dns_pod(pod: &Pod) -> bool {
    dns_container(pod).is_some()
}

fn dns_container(pod: &Pod) -> Option<&Container> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.image.as_deref() == Some(COREDNS_IMAGE))
}

/// Where a file a container sees comes from: a key of a ConfigMap or of a Secret.
#[derive(Debug, PartialEq)]
pub(crate) enum FileSource {
    ConfigMap { name: String, key: String },
    Secret { name: String, key: String },
}

/// The object and key behind `path` in `container`, as a kubelet resolves its volume mounts:
/// configMap, secret and projected volumes, with or without `items` (a mount with `subPath` is one
/// key of its volume).
pub(crate) fn file_source(spec: &PodSpec, container: &Container, path: &str) -> Option<FileSource> {
    for mount in container.volume_mounts.iter().flatten() {
        let base = mount.mount_path.trim_end_matches('/');
        let relative = match mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) if path == base => sub.to_string(),
            Some(_) => continue,
            None => match path.strip_prefix(base).and_then(|r| r.strip_prefix('/')) {
                Some(r) if !r.is_empty() => r.to_string(),
                _ => continue,
            },
        };
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)?;
        let key_of = |items: Option<&Vec<k8s_openapi::api::core::v1::KeyToPath>>| match items {
            Some(items) => items
                .iter()
                .find(|i| i.path == relative)
                .map(|i| i.key.clone()),
            None => Some(relative.clone()),
        };
        if let Some(cm) = &volume.config_map {
            return key_of(cm.items.as_ref()).map(|key| FileSource::ConfigMap {
                name: cm.name.clone(),
                key,
            });
        }
        if let Some(s) = &volume.secret {
            return key_of(s.items.as_ref()).map(|key| FileSource::Secret {
                name: s.secret_name.clone().unwrap_or_default(),
                key,
            });
        }
        // A projected source with `items` holds exactly those paths; one without holds every key
        // of its object, which only the object knows, so the first such is taken.
        let mut unlisted = None;
        for source in volume
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
        {
            let (found, items) = match (&source.config_map, &source.secret) {
                (Some(cm), _) => (
                    key_of(cm.items.as_ref()).map(|key| FileSource::ConfigMap {
                        name: cm.name.clone(),
                        key,
                    }),
                    cm.items.is_some(),
                ),
                (None, Some(s)) => (
                    key_of(s.items.as_ref()).map(|key| FileSource::Secret {
                        name: s.name.clone(),
                        key,
                    }),
                    s.items.is_some(),
                ),
                (None, None) => continue,
            };
            match (found, items) {
                (Some(found), true) => return Some(found),
                (Some(found), false) => {
                    unlisted.get_or_insert(found);
                }
                (None, _) => {}
            }
        }
        return unlisted;
    }
    None
}

/// The loopback ports one local CoreDNS uses instead of its pod's.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LocalPorts {
    pub dns: u16,
    pub health: u16,
    pub ready: u16,
    pub metrics: u16,
    /// Where the rest of the names are forwarded: nothing listens there.
    pub upstream: u16,
}

/// The Corefile `corefile` as it runs here: each server block listens on `ports.dns` of
/// 127.0.0.1; `health`, `ready` and `prometheus` listen on loopback ports of their own;
/// `kubernetes` reads the tenant API through `kubeconfig` (context `tenant`); `forward` sends to
/// `ports.upstream` on loopback. Everything else is kept. An error when the Corefile has no server
/// block or no `kubernetes` plugin, which a tenant's DNS cannot do without.
pub(crate) fn local_corefile(
    corefile: &str,
    ports: LocalPorts,
    kubeconfig: &Path,
) -> Result<String> {
    let mut out = String::new();
    let mut depth = 0usize;
    let (mut blocks, mut kubernetes) = (0, 0);
    for line in corefile.lines() {
        let trimmed = line.trim();
        let words: Vec<&str> = trimmed.split_whitespace().collect();
        let opens = trimmed.ends_with('{');
        let indent = &line[..line.len() - line.trim_start().len()];
        match (depth, words.first().copied()) {
            (0, Some(_)) if opens => {
                blocks += 1;
                let keys: Vec<String> = words[..words.len() - 1]
                    .iter()
                    .map(|k| match k.rsplit_once(':') {
                        Some((zone, _)) => format!("{zone}:{}", ports.dns),
                        None => format!("{k}:{}", ports.dns),
                    })
                    .collect();
                out.push_str(&format!("{} {{\n    bind 127.0.0.1\n", keys.join(" ")));
            }
            (1, Some("health")) => {
                out.push_str(&format!("{indent}health 127.0.0.1:{}\n", ports.health));
            }
            (1, Some("ready")) => {
                out.push_str(&format!("{indent}ready 127.0.0.1:{}\n", ports.ready));
            }
            (1, Some("prometheus")) => {
                out.push_str(&format!("{indent}prometheus 127.0.0.1:{}\n", ports.metrics));
            }
            (1, Some("forward")) if words.len() >= 3 => {
                let rest = if opens { " {" } else { "" };
                out.push_str(&format!(
                    "{indent}forward {} 127.0.0.1:{}{rest}\n",
                    words[1], ports.upstream
                ));
            }
            (1, Some("kubernetes")) => {
                kubernetes += 1;
                let config = format!("{indent}    kubeconfig {} tenant\n", kubeconfig.display());
                if opens {
                    out.push_str(line);
                    out.push('\n');
                    out.push_str(&config);
                } else {
                    out.push_str(&format!("{line} {{\n{config}{indent}}}\n"));
                }
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
        depth += trimmed.matches('{').count();
        depth = depth.saturating_sub(trimmed.matches('}').count());
    }
    if blocks == 0 {
        return Err(Error::Io("the Corefile has no server block".into()));
    }
    if kubernetes == 0 {
        return Err(Error::Io(
            "the Corefile has no kubernetes plugin, so it serves no cluster names".into(),
        ));
    }
    Ok(out)
}

/// The text of `source` in namespace `ns` on the host.
async fn read_source(client: &Client, ns: &str, source: &FileSource) -> Result<String> {
    let missing = |what: &str, name: &str, key: &str| {
        Error::Io(format!("{what} {ns}/{name} has no key {key} (yet)"))
    };
    match source {
        FileSource::ConfigMap { name, key } => {
            let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
                .get(name)
                .await?;
            cm.data
                .and_then(|d| d.get(key).cloned())
                .ok_or_else(|| missing("ConfigMap", name, key))
        }
        FileSource::Secret { name, key } => {
            let s = Api::<Secret>::namespaced(client.clone(), ns)
                .get(name)
                .await?;
            let bytes = s
                .data
                .and_then(|d| d.get(key).cloned())
                .ok_or_else(|| missing("Secret", name, key))?;
            String::from_utf8(bytes.0).map_err(|_| missing("Secret", name, key))
        }
    }
}

/// The tenant API as the local runtime serves it: its loopback address and its server CA.
pub(crate) struct TenantApi {
    pub server: String,
    pub ca_pem: String,
}

/// Start CoreDNS for the host pod `pod` of tenant `tenant`, whose API is `api`; its files live in
/// `dir`.
pub(crate) async fn launch(
    client: &Client,
    binaries: &Binaries,
    dir: &Path,
    pod: &Pod,
    tenant: &str,
    api: &TenantApi,
) -> Result<DnsServer> {
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let (Some(spec), Some(container)) = (pod.spec.as_ref(), dns_container(pod)) else {
        return Err(Error::Io(format!("pod {ns}/{name} runs no CoreDNS")));
    };
    let args = container.args.clone().unwrap_or_default();
    let conf = args
        .iter()
        .position(|a| a == "-conf")
        .and_then(|i| args.get(i + 1))
        .ok_or_else(|| Error::Io(format!("pod {ns}/{name}: CoreDNS is given no -conf file")))?;
    let unmounted =
        |path: &str| Error::Io(format!("pod {ns}/{name}: nothing is mounted at {path}"));
    let corefile_source = file_source(spec, container, conf).ok_or_else(|| unmounted(conf))?;
    let token_source =
        file_source(spec, container, TOKEN_PATH).ok_or_else(|| unmounted(TOKEN_PATH))?;
    let corefile = read_source(client, &ns, &corefile_source).await?;
    let token = read_source(client, &ns, &token_source).await?;

    let pod_dir: PathBuf = dir.join(&ns).join(format!("dns-{name}"));
    std::fs::create_dir_all(&pod_dir)?;
    let kubeconfig = pod_dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        kubeconfig::render_token("tenant", &api.server, &api.ca_pem, token.trim())?,
    )?;
    let ports = LocalPorts {
        dns: free_port()?,
        health: free_port()?,
        ready: free_port()?,
        metrics: free_port()?,
        upstream: free_port()?,
    };
    let local = local_corefile(&corefile, ports, &kubeconfig)?;
    let corefile_path = pod_dir.join("Corefile");
    std::fs::write(&corefile_path, local)?;
    let log = pod_dir.join("coredns.log");
    let handle = process::spawn(
        "tenant-coredns",
        &binaries.path("coredns"),
        &["-conf".to_string(), corefile_path.display().to_string()],
        &[],
        &log,
    )?;
    Ok(DnsServer {
        namespace: ns,
        tenant: tenant.to_string(),
        address: SocketAddr::from(([127, 0, 0, 1], ports.dns)),
        handle,
        log,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    /// The operator's CoreDNS pod as the syncer copies it to the host.
    fn copy() -> Pod {
        pod(serde_json::json!({
            "metadata": {"name": "coredns-x", "namespace": "team"},
            "spec": {
                "containers": [{
                    "name": "coredns", "image": COREDNS_IMAGE,
                    "args": ["-conf", "/etc/coredns/Corefile"],
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/etc/coredns", "readOnly": true},
                        {"name": "kube-api-access-abc",
                         "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
                    ]
                }],
                "volumes": [
                    {"name": "config", "configMap": {"name": "coredns-x-kube-system-x-dev",
                        "items": [{"key": "Corefile", "path": "Corefile"}]}},
                    {"name": "kube-api-access-abc", "projected": {"sources": [
                        {"secret": {"name": "coredns-x-token", "items": [{"key": "token-0", "path": "token"}]}},
                        {"configMap": {"name": "kube-root-ca.crt-x-kube-system-x-dev",
                            "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
                    ]}}
                ]
            }
        }))
    }

    #[test]
    fn the_corefile_and_the_token_are_found_where_the_container_sees_them() {
        let p = copy();
        let spec = p.spec.as_ref().unwrap();
        let c = dns_container(&p).unwrap();
        assert_eq!(
            file_source(spec, c, "/etc/coredns/Corefile"),
            Some(FileSource::ConfigMap {
                name: "coredns-x-kube-system-x-dev".into(),
                key: "Corefile".into()
            })
        );
        assert_eq!(
            file_source(spec, c, TOKEN_PATH),
            Some(FileSource::Secret {
                name: "coredns-x-token".into(),
                key: "token-0".into()
            })
        );
        assert_eq!(
            file_source(
                spec,
                c,
                "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
            ),
            Some(FileSource::ConfigMap {
                name: "kube-root-ca.crt-x-kube-system-x-dev".into(),
                key: "ca.crt".into()
            })
        );
        assert_eq!(file_source(spec, c, "/etc/other/file"), None);
        assert_eq!(file_source(spec, c, "/etc/coredns/Missing"), None);
        assert!(is_dns_pod(&p));
    }

    #[test]
    fn a_mount_without_items_or_with_a_sub_path_names_its_key() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "containers": [{"name": "c", "volumeMounts": [
                    {"name": "a", "mountPath": "/etc/a/"},
                    {"name": "b", "mountPath": "/etc/b.conf", "subPath": "b.conf"}
                ]}],
                "volumes": [
                    {"name": "a", "configMap": {"name": "cm-a"}},
                    {"name": "b", "secret": {"secretName": "s-b"}}
                ]
            }
        }));
        let spec = p.spec.as_ref().unwrap();
        let c = &spec.containers[0];
        assert_eq!(
            file_source(spec, c, "/etc/a/x.conf"),
            Some(FileSource::ConfigMap {
                name: "cm-a".into(),
                key: "x.conf".into()
            })
        );
        assert_eq!(
            file_source(spec, c, "/etc/b.conf"),
            Some(FileSource::Secret {
                name: "s-b".into(),
                key: "b.conf".into()
            })
        );
        assert!(!is_dns_pod(&p));
    }

    const PORTS: LocalPorts = LocalPorts {
        dns: 40001,
        health: 40002,
        ready: 40003,
        metrics: 40004,
        upstream: 40005,
    };

    #[test]
    fn the_operators_corefile_runs_on_loopback_ports_with_the_pods_token() {
        let corefile = tenantplane_syncer::addons::corefile(&["10.96.0.10".into()]);
        let local = local_corefile(&corefile, PORTS, Path::new("/d/kubeconfig")).unwrap();
        assert!(
            local.starts_with(".:40001 {\n    bind 127.0.0.1\n"),
            "{local}"
        );
        for line in [
            "    health 127.0.0.1:40002",
            "    ready 127.0.0.1:40003",
            "    prometheus 127.0.0.1:40004",
            "    forward . 127.0.0.1:40005",
            "        kubeconfig /d/kubeconfig tenant",
        ] {
            assert!(local.lines().any(|l| l == line), "no {line:?} in\n{local}");
        }
        // Nothing else changed, and nothing points off the machine.
        for kept in [
            "errors",
            "cache 30",
            "loop",
            "reload",
            "loadbalance",
            "pods insecure",
        ] {
            assert!(
                local.lines().any(|l| l.trim() == kept),
                "{kept} lost:\n{local}"
            );
        }
        assert!(!local.contains("10.96.0.10"), "{local}");
        assert_eq!(local.matches('{').count(), local.matches('}').count());
    }

    #[test]
    fn a_corefile_without_a_server_block_or_the_kubernetes_plugin_is_refused() {
        let e = local_corefile("", PORTS, Path::new("/k")).unwrap_err();
        assert!(e.to_string().contains("no server block"), "{e}");
        let e = local_corefile(".:53 {\n    forward . 1.1.1.1\n}\n", PORTS, Path::new("/k"))
            .unwrap_err();
        assert!(e.to_string().contains("no kubernetes plugin"), "{e}");
        let bare = local_corefile(
            "cluster.local:53 {\n    kubernetes\n}\n",
            PORTS,
            Path::new("/k"),
        )
        .unwrap();
        assert!(bare.contains("cluster.local:40001 {"), "{bare}");
        assert!(
            bare.contains("    kubernetes {\n        kubeconfig /k tenant\n    }\n"),
            "{bare}"
        );
    }

    /// The host's cluster DNS on a real node runs the tenants' CoreDNS image, the one
    /// `testenv/images.sh` builds (the test world knows the manifest, the syncer the image).
    #[test]
    fn the_hosts_cluster_dns_runs_the_tenants_coredns_image() {
        let yaml = tenantplane_testenv::host_cluster::real_node::CLUSTER_DNS_YAML;
        let deployment = serde_yaml::Deserializer::from_str(yaml)
            .map(|d| <serde_yaml::Value as serde::Deserialize>::deserialize(d).expect("YAML"))
            .find(|o| o["kind"] == "Deployment")
            .expect("a Deployment");
        let image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .expect("image");
        assert!(
            image.ends_with(COREDNS_IMAGE),
            "{image}: the image testenv/images.sh builds"
        );
    }
}
