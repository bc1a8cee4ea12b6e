//! The pod's own names in its `/etc/hosts`, as the tenant's cluster would write them.
//!
//! A kubelet writes a pod with a subdomain into the pod's hosts file under its fully qualified
//! name, `<hostname>.<subdomain>.<namespace>.svc.<cluster domain>`. The host's kubelet writes the
//! copy's: the host namespace, the translated subdomain, the host's domain. A tenant workload that
//! resolves its own name before DNS has it (a StatefulSet member at start, before its headless
//! Service publishes the address) would not find itself. So such a copy gets the file the
//! tenant's kubelet would have written: a first init container writes it, with the addresses the
//! host gave the pod, into a volume every other container mounts at `/etc/hosts` (a kubelet leaves
//! alone the hosts file of a container that mounts its own). Pods without a subdomain keep the
//! kubelet's file: their names in it are already the tenant's.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, ObjectFieldSelector,
    PodSpec, ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The init container that writes the file. Its status is the syncer's, never shown up.
pub const HOSTS_CONTAINER: &str = "tenantplane-hosts";
/// Its image: a shell and `printf`, nothing else is used.
pub const HOSTS_IMAGE: &str = "busybox:1.37.0";
const HOSTS_VOLUME: &str = "tenantplane-hosts";
const HOSTS_DIR: &str = "/tenantplane-hosts";
const ETC_HOSTS: &str = "/etc/hosts";

/// What a kubelet writes first in every pod's managed hosts file.
const HEAD: &str = "# Kubernetes-managed hosts file.\n\
127.0.0.1\tlocalhost\n\
::1\tlocalhost ip6-localhost ip6-loopback\n\
fe00::0\tip6-localnet\n\
fe00::0\tip6-mcastprefix\n\
fe00::1\tip6-allnodes\n\
fe00::2\tip6-allrouters\n";

/// One line per pod address (`POD_IPS`, comma-separated, from the downward API), between the
/// fixed head and the host aliases. The file is the pod's own: every container may write it, as
/// a root container may write the kubelet's.
const SCRIPT: &str = r#"set -e
printf '%s' "$HOSTS_HEAD" > "$HOSTS_FILE"
IFS=,
for ip in $POD_IPS; do printf '%s\t%s\n' "$ip" "$HOSTS_NAMES" >> "$HOSTS_FILE"; done
printf '%s' "$HOSTS_ALIASES" >> "$HOSTS_FILE"
chmod 0666 "$HOSTS_FILE"
"#;

/// The hostname a kubelet gives pod `name` whose spec says `hostname`: that, or the pod's name
/// cut to 63 characters without a trailing `-` or `.`.
fn hostname(spec_hostname: Option<&str>, name: &str) -> String {
    match spec_hostname {
        Some(h) if !h.is_empty() => h.to_string(),
        _ => name
            .get(..name.len().min(63))
            .unwrap_or(name)
            .trim_end_matches(['-', '.'])
            .to_string(),
    }
}

/// Give copy `spec` of tenant pod `ns/name` the hosts file the tenant's kubelet would write, when
/// the tenant pod has a subdomain (`tenant_subdomain`, before translation) and its own network.
pub fn rewrite(spec: &mut PodSpec, ns: &str, name: &str, tenant_subdomain: Option<&str>) {
    let Some(subdomain) = tenant_subdomain.filter(|s| !s.is_empty()) else {
        return;
    };
    let windows = spec
        .os
        .as_ref()
        .is_some_and(|os| os.name.eq_ignore_ascii_case("windows"));
    // A hostname override has no full name in a kubelet's file (only the name itself, which is
    // the tenant's already).
    if spec.host_network == Some(true) || windows || spec.hostname_override.is_some() {
        return;
    }
    let host = hostname(spec.hostname.as_deref(), name);
    let names = format!("{host}.{subdomain}.{ns}.svc.cluster.local\t{host}");
    let aliases = aliases(spec);
    let mount = VolumeMount {
        name: HOSTS_VOLUME.into(),
        mount_path: ETC_HOSTS.into(),
        sub_path: Some("hosts".into()),
        ..Default::default()
    };
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for c in containers {
        let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
        if !mounts
            .iter()
            .any(|m| m.mount_path.trim_end_matches('/') == ETC_HOSTS)
        {
            mounts.push(mount.clone());
        }
    }
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: HOSTS_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity("1Mi".into())),
            ..Default::default()
        }),
        ..Default::default()
    });
    spec.init_containers
        .get_or_insert_with(Vec::new)
        .insert(0, writer(&names, &aliases));
}

/// The host aliases' section of the file, as a kubelet writes it (empty without any).
fn aliases(spec: &PodSpec) -> String {
    let list = spec.host_aliases.as_deref().unwrap_or_default();
    if list.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for a in list {
        let ip = a.ip.as_str();
        out.push_str(&format!(
            "{ip}\t{}\n",
            a.hostnames.as_deref().unwrap_or_default().join("\t")
        ));
    }
    out
}

/// The init container that writes the file: the least a container can be (Pod Security
/// `restricted`, no root, a read-only root filesystem) and small, with requests equal to limits
/// so a Guaranteed pod stays Guaranteed.
fn writer(names: &str, aliases: &str) -> Container {
    let value = |name: &str, v: &str| EnvVar {
        name: name.into(),
        value: Some(v.into()),
        value_from: None,
    };
    let resources: BTreeMap<String, Quantity> = [
        ("cpu".to_string(), Quantity("50m".into())),
        ("memory".to_string(), Quantity("16Mi".into())),
    ]
    .into();
    Container {
        name: HOSTS_CONTAINER.into(),
        image: Some(HOSTS_IMAGE.into()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec!["/bin/sh".into(), "-c".into(), SCRIPT.into()]),
        env: Some(vec![
            value("HOSTS_FILE", &format!("{HOSTS_DIR}/hosts")),
            value("HOSTS_HEAD", HEAD),
            value("HOSTS_NAMES", names),
            value("HOSTS_ALIASES", aliases),
            EnvVar {
                name: "POD_IPS".into(),
                value: None,
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "status.podIPs".into(),
                        api_version: None,
                    }),
                    ..Default::default()
                }),
            },
        ]),
        volume_mounts: Some(vec![VolumeMount {
            name: HOSTS_VOLUME.into(),
            mount_path: HOSTS_DIR.into(),
            ..Default::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(resources.clone()),
            limits: Some(resources),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65534),
            run_as_group: Some(65534),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}

/// Leave the writer's status out of what the tenant pod shows.
pub fn hide_status(statuses: &mut Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>) {
    if let Some(list) = statuses.as_mut() {
        list.retain(|s| s.name != HOSTS_CONTAINER);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).unwrap()
    }

    fn env<'a>(c: &'a Container, name: &str) -> &'a str {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.as_deref())
            .unwrap_or_default()
    }

    #[test]
    fn a_pod_with_a_subdomain_gets_the_tenants_names_in_every_containers_hosts_file() {
        let mut s = spec(json!({
            "hostname": "web-0", "subdomain": "web-x-default-x-dev",
            "containers": [
                {"name": "app", "image": "a"},
                {"name": "own", "image": "b", "volumeMounts": [{"name": "h", "mountPath": "/etc/hosts/"}]},
            ],
            "initContainers": [{"name": "setup", "image": "c"}],
            "hostAliases": [{"ip": "10.0.0.9", "hostnames": ["db", "db.local"]}],
        }));
        rewrite(&mut s, "default", "web-0", Some("web"));
        let init = s.init_containers.as_ref().unwrap();
        assert_eq!(init[0].name, HOSTS_CONTAINER, "it runs first");
        assert_eq!(
            env(&init[0], "HOSTS_NAMES"),
            "web-0.web.default.svc.cluster.local\tweb-0"
        );
        assert_eq!(
            env(&init[0], "HOSTS_ALIASES"),
            "\n# Entries added by HostAliases.\n10.0.0.9\tdb\tdb.local\n"
        );
        let mounts_hosts = |c: &Container| {
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == HOSTS_VOLUME && m.mount_path == ETC_HOSTS)
        };
        assert!(mounts_hosts(&s.containers[0]));
        assert!(
            mounts_hosts(&init[1]),
            "an init container of the tenant's too"
        );
        assert!(
            !mounts_hosts(&s.containers[1]),
            "a container that mounts its own /etc/hosts keeps it"
        );
        assert_eq!(
            s.volumes
                .as_ref()
                .unwrap()
                .iter()
                .filter(|v| v.name == HOSTS_VOLUME)
                .count(),
            1
        );
        let sc = init[0].security_context.as_ref().unwrap();
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        let r = init[0].resources.as_ref().unwrap();
        assert_eq!(r.requests, r.limits, "a Guaranteed pod stays Guaranteed");
    }

    #[test]
    fn without_a_subdomain_or_with_the_hosts_network_the_kubelets_file_stays() {
        for (s, sub) in [
            (json!({"containers": [{"name": "a"}]}), None),
            (json!({"containers": [{"name": "a"}]}), Some("")),
            (
                json!({"hostNetwork": true, "subdomain": "x", "containers": [{"name": "a"}]}),
                Some("web"),
            ),
            (
                json!({"hostnameOverride": "me.example", "subdomain": "x", "containers": [{"name": "a"}]}),
                Some("web"),
            ),
        ] {
            let before = spec(s);
            let mut after = before.clone();
            rewrite(&mut after, "default", "p", sub);
            assert_eq!(after, before);
        }
    }

    #[test]
    fn a_long_pod_name_is_cut_as_a_kubelet_cuts_it() {
        let name = format!("{}-.x", "a".repeat(61));
        assert_eq!(hostname(None, &name), "a".repeat(61));
        assert_eq!(hostname(Some("h"), &name), "h");
    }

    /// The script, run by this machine's `sh`, writes what a kubelet writes.
    #[test]
    fn the_script_writes_the_file_a_kubelet_would() {
        let mut s =
            spec(json!({"hostname": "db-1", "subdomain": "x", "containers": [{"name": "a"}]}));
        rewrite(&mut s, "data", "db-1", Some("db"));
        let writer = &s.init_containers.as_ref().unwrap()[0];
        let dir = std::env::temp_dir().join(format!("tenantplane-hosts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("hosts");
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c").arg(SCRIPT).env_clear();
        for e in writer.env.iter().flatten() {
            if let Some(v) = &e.value {
                cmd.env(&e.name, v);
            }
        }
        cmd.env("HOSTS_FILE", &file)
            .env("POD_IPS", "10.1.0.7,fd00::7");
        assert!(cmd.status().unwrap().success());
        let written = std::fs::read_to_string(&file).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            written,
            format!(
                "{HEAD}10.1.0.7\tdb-1.db.data.svc.cluster.local\tdb-1\nfd00::7\tdb-1.db.data.svc.cluster.local\tdb-1\n"
            )
        );
    }
}
