//! The tenant's control plane: k3s as an agentless server in a StatefulSet, and the PKI Secret it
//! mounts. This is the one place that knows what a k3s control plane looks like; its Services are
//! in [`super::services`].

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, EnvVar, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PodSpec, PodTemplateSpec, Secret, SecretVolumeSource,
    SecurityContext, Toleration, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tenantplane_api::TenantCluster;

use super::BuildOptions;
use super::meta::{identity, match_labels, owned_metadata};
use super::pod::{self, CapAndNeed};
use crate::tenant_pki::TenantPki;
use crate::{Error, names};

mod args;
mod probes;
mod releases;
pub use args::{Addressing, k3s_args};
use probes::probes;
pub use releases::k3s_tag;

/// The image of tenant `tc`'s control plane: its own `spec.controlPlane.image`, else the k3s
/// release of its Kubernetes version from `options`' repository.
pub fn control_plane_image(tc: &TenantCluster, options: &BuildOptions) -> String {
    tc.spec
        .control_plane
        .image
        .clone()
        .unwrap_or_else(|| names::k3s_image(&options.k3s_repository, &tc.spec.kubernetes_version))
}

/// k3s keeps its state here, on the volume.
pub const DATA_DIR: &str = "/var/lib/rancher/k3s";
/// The PKI Secret is mounted here and copied into `<data-dir>/server/tls/`, because k3s writes
/// further files into that folder.
pub const PKI_MOUNT: &str = "/etc/tenantplane/pki";
/// The kubelet CA's file in `server/tls/`, and the init container's variable that carries it.
pub const KUBELET_CA_FILE: &str = "kubelet-ca.crt";
pub const KUBELET_CA_ENV: &str = "TENANTPLANE_KUBELET_CA";
/// Size of the sqlite volume: the API's, whose storage caps must hold it.
pub const DATA_VOLUME_SIZE: &str = tenantplane_api::tenant_cluster::CONTROL_PLANE_DATA_SIZE;
/// k3s runs as this unprivileged user; without an agent it needs no root.
pub const RUN_AS_USER: i64 = 10001;

/// What the control plane requests of the tenant's quota (an agentless k3s server's need).
pub const CONTROL_PLANE_CPU_REQUEST: &str = "250m";
pub const CONTROL_PLANE_MEMORY_REQUEST: &str = "512Mi";

/// The StatefulSet running k3s. It passes Pod Security `restricted`: non-root, no privilege
/// escalation, no capabilities, RuntimeDefault seccomp, no service-account token.
pub fn desired_statefulset(
    tc: &TenantCluster,
    addressing: &Addressing,
    options: &BuildOptions,
) -> Result<StatefulSet, Error> {
    let (tenant, ns) = identity(tc)?;
    let image = control_plane_image(tc, options);
    let mut pod_labels = names::labels(&tenant);
    pod_labels.extend(names::control_plane_selector(&tenant));
    if options.local_runtime {
        pod_labels.insert(names::LABEL_RUNTIME.into(), names::RUNTIME_LOCAL.into());
    }
    // The caps limit the control plane; it always requests what an agentless k3s needs (never
    // BestEffort, the first evicted), so the rest of the tenant's quota is left for its workloads.
    let resources = pod::capped_resources([
        CapAndNeed {
            resource: "cpu",
            cap: tc.spec.resources.cpu.as_ref(),
            need: CONTROL_PLANE_CPU_REQUEST.into(),
        },
        CapAndNeed {
            resource: "memory",
            cap: tc.spec.resources.memory.as_ref(),
            need: CONTROL_PLANE_MEMORY_REQUEST.into(),
        },
    ]);
    let (startup, liveness, readiness) = probes();
    let k3s = Container {
        name: "k3s".into(),
        image: Some(image.clone()),
        command: Some(vec!["/bin/k3s".into()]),
        args: Some(k3s_args(&tenant, &ns, addressing, options)),
        ports: Some(vec![ContainerPort {
            name: Some("https".into()),
            container_port: names::API_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        startup_probe: Some(startup),
        liveness_probe: Some(liveness),
        readiness_probe: Some(readiness),
        resources: Some(resources),
        // k3s's kubectl keeps a cache under $HOME, and k3s links its kubeconfig there.
        env: Some(vec![EnvVar {
            name: "HOME".into(),
            value: Some(DATA_DIR.into()),
            value_from: None,
        }]),
        security_context: Some(security_context()),
        volume_mounts: Some(vec![
            data_mount(),
            scratch_mount(RANCHER_ETC_VOLUME, RANCHER_ETC),
            scratch_mount(TMP_VOLUME, "/tmp"),
        ]),
        ..Default::default()
    };
    let pki_volume = Volume {
        name: "pki".into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(names::pki_secret(&tenant)),
            default_mode: Some(0o400),
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok(StatefulSet {
        metadata: owned_metadata(tc, names::statefulset(&tenant))?,
        spec: Some(StatefulSetSpec {
            service_name: Some(names::headless_service(&tenant)),
            replicas: Some(tc.spec.control_plane.replicas),
            pod_management_policy: Some("Parallel".into()),
            // The datastore goes with the tenant (the finalizer deletes it too, for claims made
            // before this policy); scaling down keeps it.
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some("Delete".into()),
                    when_scaled: Some("Retain".into()),
                },
            ),
            selector: match_labels(names::control_plane_selector(&tenant)),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    security_context: Some(pod::restricted_pod(RUN_AS_USER)),
                    init_containers: Some(vec![pki_init_container(image, options)]),
                    containers: vec![k3s],
                    volumes: Some(vec![
                        pki_volume,
                        scratch_volume(RANCHER_ETC_VOLUME, "1Mi"),
                        scratch_volume(TMP_VOLUME, "64Mi"),
                    ]),
                    node_selector: local_runtime_node_selector(options),
                    tolerations: local_runtime_tolerations(options),
                    ..Default::default()
                }),
            },
            volume_claim_templates: Some(vec![data_claim_template()]),
            ..Default::default()
        }),
        status: None,
    })
}

/// The local runtime's pods go to the simulated node it stands behind (tests and the dev cluster
/// only; a real k3s pod goes wherever the scheduler puts it).
fn local_runtime_node_selector(options: &BuildOptions) -> Option<BTreeMap<String, String>> {
    let (key, value) = names::LOCAL_RUNTIME_NODE_LABEL;
    options
        .local_runtime
        .then(|| BTreeMap::from([(key.to_string(), value.to_string())]))
}

fn local_runtime_tolerations(options: &BuildOptions) -> Option<Vec<Toleration>> {
    options.local_runtime.then(|| {
        vec![Toleration {
            key: Some(names::SIMULATED_NODE_TAINT.into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }]
    })
}

/// k3s writes here even without an agent (its agent setup makes `/etc/rancher/node/password`
/// at every start); the image's `/etc` is root's, so an unprivileged k3s gets a folder of its own
/// and, without it, never finishes starting.
pub const RANCHER_ETC: &str = "/etc/rancher";
const RANCHER_ETC_VOLUME: &str = "rancher-etc";
const TMP_VOLUME: &str = "tmp";

/// Both containers' security context: `restricted`, as k3s's user, on a read-only root: every
/// place k3s writes is a volume (its data, `/etc/rancher`, `/tmp`).
fn security_context() -> SecurityContext {
    SecurityContext {
        read_only_root_filesystem: Some(true),
        ..pod::restricted_container(RUN_AS_USER)
    }
}

/// A folder of the pod's own, gone with it, at most `size`.
fn scratch_volume(name: &str, size: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity(size.into())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn scratch_mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        ..Default::default()
    }
}

/// The datastore volume, at k3s's data directory.
fn data_mount() -> VolumeMount {
    VolumeMount {
        name: names::DATA_VOLUME.into(),
        mount_path: DATA_DIR.into(),
        ..Default::default()
    }
}

/// The init container that copies the PKI Secret into k3s's TLS folder (and writes the kubelet
/// CA there, when the operator serves a kubelet endpoint).
fn pki_init_container(image: String, options: &BuildOptions) -> Container {
    let tls_dir = format!("{DATA_DIR}/server/tls");
    let mut copy_pki =
        format!("mkdir -p {tls_dir} && cp {PKI_MOUNT}/* {tls_dir}/ && chmod 600 {tls_dir}/*.key");
    let mut env = None;
    if let Some(kubelet) = &options.kubelet {
        // The CA is public; the pod spec carries it, so it needs no object of its own.
        copy_pki.push_str(&format!(
            " && printf '%s\\n' \"${KUBELET_CA_ENV}\" > {tls_dir}/{KUBELET_CA_FILE}"
        ));
        env = Some(vec![EnvVar {
            name: KUBELET_CA_ENV.into(),
            value: Some(kubelet.ca_pem.clone()),
            value_from: None,
        }]);
    }
    Container {
        name: "pki".into(),
        image: Some(image),
        command: Some(vec!["/bin/sh".into(), "-c".into(), copy_pki]),
        env,
        security_context: Some(security_context()),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "pki".into(),
                mount_path: PKI_MOUNT.into(),
                read_only: Some(true),
                ..Default::default()
            },
            data_mount(),
        ]),
        ..Default::default()
    }
}

/// The claim of each control-plane pod for its sqlite datastore.
fn data_claim_template() -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(names::DATA_VOLUME.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some([("storage".into(), Quantity(DATA_VOLUME_SIZE.into()))].into()),
                limits: None,
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// The PKI Secret for a freshly generated PKI. Created once, never overwritten.
pub fn pki_secret(tc: &TenantCluster, pki: &TenantPki) -> Result<Secret, Error> {
    let (tenant, _) = identity(tc)?;
    Ok(Secret {
        metadata: owned_metadata(tc, names::pki_secret(&tenant))?,
        type_: Some("Opaque".into()),
        data: Some(pki.to_secret_data()),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures::tenant;

    const TEST_API_IP: &str = "10.96.0.10";

    fn addressing() -> Addressing {
        Addressing {
            api_ip: TEST_API_IP.into(),
            service_cidr: "10.96.0.0/12".into(),
        }
    }

    #[test]
    fn the_version_picks_the_k3s_image() {
        let sts = desired_statefulset(&tenant(), &addressing(), &BuildOptions::default()).unwrap();
        let spec = sts.spec.unwrap().template.spec.unwrap();
        assert_eq!(
            spec.containers[0].image.as_deref(),
            Some("rancher/k3s:v1.30.4-k3s1")
        );
        let options = BuildOptions {
            k3s_repository: "mirror.example/k3s".into(),
            ..Default::default()
        };
        let sts = desired_statefulset(&tenant(), &addressing(), &options).unwrap();
        let spec = sts.spec.unwrap().template.spec.unwrap();
        assert_eq!(
            spec.containers[0].image.as_deref(),
            Some("mirror.example/k3s:v1.30.4-k3s1")
        );
        assert_eq!(
            spec.init_containers.unwrap()[0].image.as_deref(),
            Some("mirror.example/k3s:v1.30.4-k3s1")
        );
        // A respun release runs its latest build; a tenant's own image wins over both.
        let mut respun = tenant();
        respun.spec.kubernetes_version = "v1.30.14".into();
        let sts = desired_statefulset(&respun, &addressing(), &BuildOptions::default()).unwrap();
        let spec = sts.spec.unwrap().template.spec.unwrap();
        assert_eq!(
            spec.containers[0].image.as_deref(),
            Some("rancher/k3s:v1.30.14-k3s2")
        );
        let mut pinned = tenant();
        pinned.spec.control_plane.image = Some("registry.example/k3s:v1.30.4-k3s9".into());
        let sts = desired_statefulset(&pinned, &addressing(), &options).unwrap();
        let spec = sts.spec.unwrap().template.spec.unwrap();
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            assert_eq!(
                c.image.as_deref(),
                Some("registry.example/k3s:v1.30.4-k3s9")
            );
        }
    }

    #[test]
    fn the_api_server_trusts_the_kubelet_ca_the_init_container_writes() {
        let plain =
            desired_statefulset(&tenant(), &addressing(), &BuildOptions::default()).unwrap();
        let plain = serde_json::to_value(plain).unwrap();
        let plain_init = &plain["spec"]["template"]["spec"]["initContainers"][0];
        assert!(plain_init.get("env").is_none());
        let options = crate::build::fixtures::with_kubelet(BuildOptions::default());
        let sts =
            serde_json::to_value(desired_statefulset(&tenant(), &addressing(), &options).unwrap())
                .unwrap();
        let spec = &sts["spec"]["template"]["spec"];
        let init = &spec["initContainers"][0];
        assert_eq!(init["env"][0]["name"], KUBELET_CA_ENV);
        assert!(init["env"][0]["value"].as_str().unwrap().contains("MIIB"));
        let script = init["command"][2].as_str().unwrap();
        assert!(
            script.ends_with(&format!(
                "printf '%s\\n' \"$TENANTPLANE_KUBELET_CA\" > {DATA_DIR}/server/tls/{KUBELET_CA_FILE}"
            )),
            "{script}"
        );
        let args: Vec<&str> = spec["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        assert!(args.contains(&format!("--kube-apiserver-arg=kubelet-certificate-authority={DATA_DIR}/server/tls/{KUBELET_CA_FILE}").as_str()), "{args:?}");
        assert!(
            args.contains(&"--kube-apiserver-arg=kubelet-preferred-address-types=Hostname,InternalIP,ExternalIP"),
            "{args:?}"
        );
    }

    #[test]
    fn resources_cap_the_control_plane_which_requests_little() {
        let sts = desired_statefulset(&tenant(), &addressing(), &BuildOptions::default()).unwrap();
        let c = &sts.spec.unwrap().template.spec.unwrap().containers[0];
        let r = c.resources.as_ref().unwrap();
        assert_eq!(r.limits.as_ref().unwrap()["cpu"].0, "2");
        assert_eq!(r.limits.as_ref().unwrap()["memory"].0, "2Gi");
        assert_eq!(r.requests.as_ref().unwrap()["cpu"].0, "250m");
        assert_eq!(r.requests.as_ref().unwrap()["memory"].0, "512Mi");
        let mut small = tenant();
        small.spec.resources.cpu = Some("100m".into());
        let sts = desired_statefulset(&small, &addressing(), &BuildOptions::default()).unwrap();
        let c = &sts.spec.unwrap().template.spec.unwrap().containers[0];
        let r = c.resources.as_ref().unwrap();
        assert_eq!(
            r.requests.as_ref().unwrap()["cpu"].0,
            "100m",
            "never above the cap"
        );
    }

    #[test]
    fn k3s_writes_only_to_its_volumes_on_a_read_only_root() {
        let sts = desired_statefulset(&tenant(), &addressing(), &BuildOptions::default()).unwrap();
        let spec = sts.spec.unwrap().template.spec.unwrap();
        let k3s = &spec.containers[0];
        let mounts: Vec<&str> = k3s
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str())
            .collect();
        for path in [DATA_DIR, RANCHER_ETC, "/tmp"] {
            assert!(mounts.contains(&path), "{path}: {mounts:?}");
        }
        let volumes = spec.volumes.as_ref().unwrap();
        for name in [RANCHER_ETC_VOLUME, TMP_VOLUME] {
            let v = volumes.iter().find(|v| v.name == name).unwrap();
            assert!(v.empty_dir.as_ref().unwrap().size_limit.is_some(), "{name}");
        }
        let home = k3s.env.iter().flatten().find(|e| e.name == "HOME").unwrap();
        assert_eq!(home.value.as_deref(), Some(DATA_DIR));
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
        }
    }

    #[test]
    fn an_uncapped_control_plane_still_requests_what_it_needs() {
        let mut open = tenant();
        open.spec.resources.cpu = None;
        open.spec.resources.memory = None;
        let sts = desired_statefulset(&open, &addressing(), &BuildOptions::default()).unwrap();
        let c = &sts.spec.unwrap().template.spec.unwrap().containers[0];
        let r = c.resources.as_ref().unwrap();
        let requests = r.requests.as_ref().expect("never BestEffort");
        assert_eq!(requests["cpu"].0, CONTROL_PLANE_CPU_REQUEST);
        assert_eq!(requests["memory"].0, CONTROL_PLANE_MEMORY_REQUEST);
        assert_eq!(r.limits, None);
    }

    #[test]
    fn the_pod_meets_restricted_pod_security() {
        let sts = desired_statefulset(&tenant(), &addressing(), &BuildOptions::default()).unwrap();
        let spec = sts.spec.unwrap().template.spec.unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false));
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(sc.allow_privilege_escalation, Some(false));
            assert_eq!(sc.run_as_non_root, Some(true));
            assert_eq!(
                sc.capabilities.as_ref().unwrap().drop.as_ref().unwrap(),
                &["ALL"]
            );
            assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
        }
    }

    #[test]
    fn only_the_local_runtime_gets_its_label() {
        let sts = desired_statefulset(&tenant(), &addressing(), &BuildOptions::default()).unwrap();
        let labels = sts.spec.unwrap().template.metadata.unwrap().labels.unwrap();
        assert!(!labels.contains_key(names::LABEL_RUNTIME));
        let options = BuildOptions {
            local_runtime: true,
            ..Default::default()
        };
        let sts = desired_statefulset(&tenant(), &addressing(), &options).unwrap();
        let template = sts.spec.unwrap().template;
        let labels = template.metadata.unwrap().labels.unwrap();
        assert_eq!(labels[names::LABEL_RUNTIME], names::RUNTIME_LOCAL);
        let spec = template.spec.unwrap();
        assert_eq!(spec.node_selector.unwrap()["type"], "kwok");
        assert_eq!(
            spec.tolerations.unwrap()[0].key.as_deref(),
            Some(names::SIMULATED_NODE_TAINT)
        );
        let plain = desired_statefulset(&tenant(), &addressing(), &BuildOptions::default())
            .unwrap()
            .spec
            .unwrap()
            .template
            .spec
            .unwrap();
        assert!(plain.node_selector.is_none() && plain.tolerations.is_none());
    }

    #[test]
    fn a_headless_service_governs_the_statefulset_and_its_claim_goes_with_it() {
        use crate::build::services::{desired_headless_service, desired_service};
        let headless = desired_headless_service(&tenant()).unwrap();
        assert_eq!(headless.metadata.name.as_deref(), Some("dev-headless"));
        let spec = headless.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        assert_eq!(spec.selector.unwrap(), names::control_plane_selector("dev"));
        let api = desired_service(&tenant()).unwrap().spec.unwrap();
        assert_eq!(api.cluster_ip, None, "the API Service keeps its cluster IP");
        let sts = desired_statefulset(&tenant(), &addressing(), &BuildOptions::default()).unwrap();
        let spec = sts.spec.unwrap();
        assert_eq!(spec.service_name.as_deref(), Some("dev-headless"));
        let retention = spec.persistent_volume_claim_retention_policy.unwrap();
        assert_eq!(retention.when_deleted.as_deref(), Some("Delete"));
        assert_eq!(retention.when_scaled.as_deref(), Some("Retain"));
        let claim = &spec.volume_claim_templates.unwrap()[0];
        assert_eq!(
            format!("{}-{}-0", claim.metadata.name.as_deref().unwrap(), "dev"),
            names::data_claim("dev", 0)
        );
    }
}
