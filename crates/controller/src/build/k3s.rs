//! k3s as the tenant's control plane (the default distribution): an agentless server in one
//! container, fed the tenant's PKI by an init container. The StatefulSet around it is
//! `control_plane`'s; its Services are in `services`.

use k8s_openapi::api::core::v1::{Container, ContainerPort, EnvVar};
use tenantplane_api::TenantCluster;

use super::BuildOptions;
use super::layout::{
    Addressing, CONFIG_MOUNT, CONFIG_VOLUME, CONTROL_PLANE_CPU_REQUEST,
    CONTROL_PLANE_MEMORY_REQUEST, DATA_DIR, PKI_MOUNT, PKI_VOLUME, Pod, TMP_VOLUME, data_mount,
    mount, read_only_mount, scratch_volume, security_context, sqlite_temp_dir,
};
use super::lean;
use super::pod::{self, CapAndNeed};
use crate::names;

mod args;
mod probes;
mod releases;
pub(crate) use args::controllers;
pub use args::{KUBELET_ADDRESS_ORDER, KUBELET_ADDRESS_TYPES, k3s_args};
use probes::probes;
pub use releases::k3s_tag;

/// The image of tenant `tc`'s control plane: its own `spec.controlPlane.image`, else the k3s
/// release of its Kubernetes version from `options`' repository.
pub fn control_plane_image(tc: &TenantCluster, options: &BuildOptions) -> String {
    tc.spec
        .control_plane
        .image
        .clone()
        .unwrap_or_else(|| k3s_image(&options.k3s_repository, &tc.spec.kubernetes_version))
}

/// `v1.30.4` runs `<repository>:v1.30.4-k3s1`; a respun release its latest build ([`k3s_tag`]).
pub fn k3s_image(repository: &str, kubernetes_version: &str) -> String {
    format!("{repository}:{}", k3s_tag(kubernetes_version))
}

/// The kubelet CA's file in `server/tls/`, and the init container's variable that carries it.
pub const KUBELET_CA_FILE: &str = "kubelet-ca.crt";
/// The init container's variable that carries the kubelet CA.
pub const KUBELET_CA_ENV: &str = "TENANTPLANE_KUBELET_CA";

/// k3s writes here even without an agent (its agent setup makes `/etc/rancher/node/password`
/// at every start); the image's `/etc` is root's, so an unprivileged k3s gets a folder of its own
/// and, without it, never finishes starting.
pub const RANCHER_ETC: &str = "/etc/rancher";
const RANCHER_ETC_VOLUME: &str = "rancher-etc";

/// The k3s pod: the PKI copied into k3s's TLS folder, then `k3s server`.
pub(super) fn pod(
    tc: &TenantCluster,
    tenant: &str,
    ns: &str,
    addressing: &Addressing,
    options: &BuildOptions,
) -> Pod {
    let image = control_plane_image(tc, options);
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
        args: Some(k3s_args(tenant, ns, addressing, options)),
        ports: Some(vec![ContainerPort {
            name: Some("https".into()),
            container_port: names::API_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        startup_probe: Some(startup),
        liveness_probe: Some(liveness),
        readiness_probe: Some(readiness),
        // k3s's kubectl keeps a cache under $HOME, and k3s links its kubeconfig there. Its one
        // process runs every component, so the Go runtime's settings follow the pod's limit.
        env: Some(
            [
                EnvVar {
                    name: "HOME".into(),
                    value: Some(DATA_DIR.into()),
                    value_from: None,
                },
                sqlite_temp_dir(),
            ]
            .into_iter()
            .chain(lean::go_runtime_env(&resources))
            .collect(),
        ),
        resources: Some(resources),
        security_context: Some(security_context()),
        volume_mounts: Some(vec![
            data_mount(),
            mount(RANCHER_ETC_VOLUME, RANCHER_ETC),
            mount(TMP_VOLUME, "/tmp"),
            read_only_mount(CONFIG_VOLUME, CONFIG_MOUNT),
        ]),
        ..Default::default()
    };
    Pod {
        init_containers: vec![pki_init_container(image, options)],
        containers: vec![k3s],
        volumes: vec![
            scratch_volume(RANCHER_ETC_VOLUME, "1Mi"),
            scratch_volume(TMP_VOLUME, "64Mi"),
        ],
    }
}

/// The init container that copies the PKI Secret into k3s's TLS folder (and writes the kubelet
/// CA there, when the operator serves a kubelet endpoint): k3s writes further files into that
/// folder, so it cannot be the Secret's read-only mount.
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
        volume_mounts: Some(vec![read_only_mount(PKI_VOLUME, PKI_MOUNT), data_mount()]),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::BuildOptions;
    use crate::build::fixtures::tenant;
    use crate::build::layout::DATABASE_DIR;
    use k8s_openapi::api::apps::v1::StatefulSet;

    fn desired_statefulset(
        tc: &TenantCluster,
        addressing: &Addressing,
        options: &BuildOptions,
    ) -> Result<StatefulSet, crate::Error> {
        crate::build::control_plane::desired_statefulset(tc, addressing, options, "digest")
    }

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
            .filter(|c| c.name != super::super::agent::CONTAINER)
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
    fn k3s_gets_go_memory_settings_from_the_pods_limit() {
        let env_of = |tc: &TenantCluster| {
            let sts = desired_statefulset(tc, &addressing(), &BuildOptions::default()).unwrap();
            let c = sts.spec.unwrap().template.spec.unwrap().containers[0].clone();
            c.env
                .unwrap()
                .into_iter()
                .map(|e| (e.name, e.value.unwrap_or_default()))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        // 2Gi: one process, all of it.
        let env = env_of(&tenant());
        assert_eq!(env["GOGC"], lean::GOGC);
        assert_eq!(env["GOMEMLIMIT"], "1740MiB");
        assert!(env.contains_key("HOME") && env.contains_key("SQLITE_TMPDIR"));
        let mut open = tenant();
        open.spec.resources.memory = None;
        let env = env_of(&open);
        assert_eq!(env["GOGC"], lean::GOGC);
        assert!(!env.contains_key("GOMEMLIMIT"), "{env:?}");
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
        // sqlite's temporary files (its embedded kine's): the database's folder on the claim,
        // never the read-only root or the small /tmp.
        let temp = k3s.env.iter().flatten().find(|e| e.name == "SQLITE_TMPDIR");
        assert_eq!(temp.unwrap().value.as_deref(), Some(DATABASE_DIR));
        assert!(DATABASE_DIR.starts_with(&format!("{DATA_DIR}/")));
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
