//! The checks on a pod: host access, confinement, volume sources, classes, and the placement a
//! host copy keeps.

use k8s_openapi::api::core::v1::{Container, PodSpec};
use tenantplane_api::Allowances;

use super::values::listed;

/// Why a pod may not run on the host under `allow`; empty when it may.
pub fn pod_refusals(allow: &Allowances, spec: &PodSpec) -> Vec<String> {
    let mut out = host_access_refusals(allow, spec);
    for c in containers(spec) {
        out.extend(container_refusals(allow, c));
    }
    if !allow.privileged {
        out.extend(pod_confinement_refusals(allow, spec));
    }
    out.extend(source_refusals(allow, spec));
    out.extend(super::resources::resource_refusals(allow, spec));
    out.extend(super::images::image_refusals(allow, spec));
    out.extend(super::pod_fields::field_refusals(allow, spec));
    out
}

/// `what` refused when `on`, naming the IsolationProfile's `allow.field` that is off.
fn refuse(out: &mut Vec<String>, on: bool, what: &str, field: &str) {
    if on {
        out.push(format!(
            "{what} is not allowed for tenant pods (the IsolationProfile's allow.{field} is off)"
        ));
    }
}

fn host_process(w: Option<&k8s_openapi::api::core::v1::WindowsSecurityContextOptions>) -> bool {
    w.and_then(|w| w.host_process) == Some(true)
}

/// The pod's ways into the node: its namespaces, a host process, host paths.
fn host_access_refusals(allow: &Allowances, spec: &PodSpec) -> Vec<String> {
    let mut out = Vec::new();
    refuse(
        &mut out,
        spec.host_network == Some(true) && !allow.host_network,
        "spec.hostNetwork",
        "hostNetwork",
    );
    refuse(
        &mut out,
        spec.host_pid == Some(true) && !allow.host_pid,
        "spec.hostPID",
        "hostPID",
    );
    refuse(
        &mut out,
        spec.host_ipc == Some(true) && !allow.host_ipc,
        "spec.hostIPC",
        "hostIPC",
    );
    refuse(
        &mut out,
        host_process(
            spec.security_context
                .as_ref()
                .and_then(|s| s.windows_options.as_ref()),
        ) && !allow.privileged,
        "spec.securityContext.windowsOptions.hostProcess",
        "privileged",
    );
    for v in spec.volumes.iter().flatten() {
        refuse(
            &mut out,
            v.host_path.is_some() && !allow.host_path,
            &format!("volume {:?} (hostPath)", v.name),
            "hostPath",
        );
    }
    out
}

/// One container's: privilege, host ports, capabilities, probe and hook hosts, confinement, and
/// resource claims.
fn container_refusals(allow: &Allowances, c: &Container) -> Vec<String> {
    let mut out = Vec::new();
    let sc = c.security_context.as_ref();
    refuse(
        &mut out,
        sc.and_then(|s| s.privileged) == Some(true) && !allow.privileged,
        &format!("container {:?}: privileged", c.name),
        "privileged",
    );
    refuse(
        &mut out,
        host_process(sc.and_then(|s| s.windows_options.as_ref())) && !allow.privileged,
        &format!("container {:?}: windowsOptions.hostProcess", c.name),
        "privileged",
    );
    refuse(
        &mut out,
        sc.and_then(|s| s.proc_mount.as_deref()) == Some("Unmasked") && !allow.privileged,
        &format!("container {:?}: procMount Unmasked", c.name),
        "privileged",
    );
    for p in c.ports.iter().flatten() {
        refuse(
            &mut out,
            p.host_port.is_some_and(|p| p != 0) && !allow.host_ports,
            &format!(
                "container {:?}: hostPort {}",
                c.name,
                p.host_port.unwrap_or(0)
            ),
            "hostPorts",
        );
    }
    let added = sc
        .and_then(|s| s.capabilities.as_ref())
        .and_then(|c| c.add.as_ref());
    for cap in added.into_iter().flatten() {
        let bare = cap.trim_start_matches("CAP_");
        if !allow
            .capabilities
            .iter()
            .any(|a| a.trim_start_matches("CAP_") == bare)
        {
            out.push(format!(
                "container {:?} adds capability {cap}, which the IsolationProfile's allow.capabilities does not list",
                c.name
            ));
        }
    }
    // The kubelet dials a probe's or hook's `host` from the node's network: anywhere the
    // node reaches (its own ports, the metadata service, other tenants), around NetworkPolicy.
    for (what, host) in handler_hosts(c) {
        out.push(format!(
            "container {:?}: {what} names host {host:?}; probes and hooks reach only the pod's own address",
            c.name
        ));
    }
    if !allow.privileged {
        out.extend(confinement(
            allow,
            &format!("container {:?}", c.name),
            sc.and_then(|s| s.seccomp_profile.as_ref()),
            sc.and_then(|s| s.app_armor_profile.as_ref()),
            sc.and_then(|s| s.se_linux_options.as_ref()),
        ));
    }
    if c.resources.as_ref().is_some_and(|r| r.claims.is_some()) {
        out.push(format!(
            "container {:?} claims resources (resources.claims); dynamic resource allocation is not offered to tenant pods",
            c.name
        ));
    }
    out
}

/// The pod-level confinement and sysctls, for a profile that does not allow privilege.
fn pod_confinement_refusals(allow: &Allowances, spec: &PodSpec) -> Vec<String> {
    let psc = spec.security_context.as_ref();
    let mut out = confinement(
        allow,
        "the pod",
        psc.and_then(|s| s.seccomp_profile.as_ref()),
        psc.and_then(|s| s.app_armor_profile.as_ref()),
        psc.and_then(|s| s.se_linux_options.as_ref()),
    );
    for sysctl in psc.and_then(|s| s.sysctls.as_ref()).into_iter().flatten() {
        if !SAFE_SYSCTLS.contains(&sysctl.name.as_str()) {
            out.push(format!(
                "sysctl {} is not one of the namespaced safe ones (the IsolationProfile's allow.privileged is off)",
                sysctl.name
            ));
        }
    }
    out
}

/// What the pod draws on beyond the node: CSI drivers, a runtime class, resource claims.
fn source_refusals(allow: &Allowances, spec: &PodSpec) -> Vec<String> {
    let mut out = Vec::new();
    for v in spec.volumes.iter().flatten() {
        if let Some(csi) = &v.csi
            && !allow.csi_drivers.contains(&csi.driver)
        {
            out.push(format!(
                "volume {:?} uses CSI driver {}, which the IsolationProfile's allow.csiDrivers does not list{}",
                v.name,
                csi.driver,
                listed(&allow.csi_drivers)
            ));
        }
    }
    if let Some(class) = &spec.runtime_class_name
        && !allow.runtime_classes.contains(class)
    {
        // A tenant class whose handler a listed class has was translated to it before.
        out.push(format!(
            "runtimeClassName {class:?} is not in the IsolationProfile's allow.runtimeClasses{}{}",
            listed(&allow.runtime_classes),
            if allow.runtime_classes.is_empty() {
                ""
            } else {
                ", and none of those the host has runs the handler of a tenant RuntimeClass of that name"
            }
        ));
    }
    if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) {
        out.push(
            "spec.resourceClaims: dynamic resource allocation is not offered to tenant pods".into(),
        );
    }
    out
}

/// Sysctls every pod may set: namespaced, and what Pod Security `baseline` allows.
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ping_group_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// SELinux types a container may ask for (those Pod Security `baseline` allows).
const CONTAINER_SELINUX_TYPES: &[&str] = &[
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// Why a pod's or container's confinement (seccomp, AppArmor, SELinux) is not allowed.
fn confinement(
    allow: &Allowances,
    who: &str,
    seccomp: Option<&k8s_openapi::api::core::v1::SeccompProfile>,
    apparmor: Option<&k8s_openapi::api::core::v1::AppArmorProfile>,
    selinux: Option<&k8s_openapi::api::core::v1::SELinuxOptions>,
) -> Vec<String> {
    let mut out = Vec::new();
    let off = "(the IsolationProfile's allow.privileged is off)";
    if seccomp.is_some_and(|p| p.type_ == "Unconfined") {
        out.push(format!("{who}: seccomp Unconfined is not allowed {off}"));
    }
    if apparmor.is_some_and(|p| p.type_ == "Unconfined") {
        out.push(format!("{who}: AppArmor Unconfined is not allowed {off}"));
    }
    // A Localhost profile is a file on the host node: the tenant would choose the host's
    // confinement, so only the profiles the platform lists.
    let localhost = [
        ("seccomp", seccomp.map(|p| (&p.type_, &p.localhost_profile))),
        (
            "AppArmor",
            apparmor.map(|p| (&p.type_, &p.localhost_profile)),
        ),
    ];
    for (what, profile) in localhost {
        let Some((kind, name)) = profile else {
            continue;
        };
        let name = name.as_deref().unwrap_or_default();
        if kind == "Localhost" && !allow.localhost_profiles.iter().any(|p| p == name) {
            out.push(format!(
                "{who}: {what} Localhost profile {name:?} is not in the IsolationProfile's allow.localhostProfiles{}",
                listed(&allow.localhost_profiles)
            ));
        }
    }
    if let Some(se) = selinux {
        let type_ok = se
            .type_
            .as_deref()
            .is_none_or(|t| t.is_empty() || CONTAINER_SELINUX_TYPES.contains(&t));
        if se.user.is_some() || se.role.is_some() || !type_ok {
            out.push(format!(
                "{who}: SELinux options other than a container type and level are not allowed {off}"
            ));
        }
    }
    out
}

/// The `host` fields a container's probes and lifecycle hooks name, by where they are.
fn handler_hosts(c: &Container) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let probes = [
        ("livenessProbe", c.liveness_probe.as_ref()),
        ("readinessProbe", c.readiness_probe.as_ref()),
        ("startupProbe", c.startup_probe.as_ref()),
    ];
    for (what, probe) in probes {
        let Some(p) = probe else { continue };
        if let Some(h) = p.http_get.as_ref().and_then(|g| g.host.clone()) {
            out.push((format!("{what}.httpGet"), h));
        }
        if let Some(h) = p.tcp_socket.as_ref().and_then(|t| t.host.clone()) {
            out.push((format!("{what}.tcpSocket"), h));
        }
    }
    let hooks = c.lifecycle.as_ref().map(|l| {
        [
            ("lifecycle.postStart", l.post_start.as_ref()),
            ("lifecycle.preStop", l.pre_stop.as_ref()),
        ]
    });
    for (what, hook) in hooks.into_iter().flatten() {
        let Some(h) = hook else { continue };
        if let Some(host) = h.http_get.as_ref().and_then(|g| g.host.clone()) {
            out.push((format!("{what}.httpGet"), host));
        }
        if let Some(host) = h.tcp_socket.as_ref().and_then(|t| t.host.clone()) {
            out.push((format!("{what}.tcpSocket"), host));
        }
    }
    out.retain(|(_, h)| !h.is_empty());
    out
}

/// Every container of a pod spec: init (and sidecar) containers and app containers.
fn containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn spec(v: Value) -> PodSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn host_access_is_refused_unless_the_profile_opts_in_to_each() {
        let risky = spec(json!({
            "hostNetwork": true, "hostPID": true, "hostIPC": true,
            "runtimeClassName": "runc-unsandboxed",
            "volumes": [{"name": "root", "hostPath": {"path": "/"}},
                        {"name": "ceph", "cephfs": {"monitors": ["m"], "secretRef": {"name": "x-pki"}}},
                        {"name": "git", "gitRepo": {"repository": "r"}},
                        {"name": "p", "projected": {"sources": [{"clusterTrustBundle": {"path": "b", "name": "n"}}]}}],
            "containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80}],
                "securityContext": {"privileged": true, "capabilities": {"add": ["SYS_ADMIN", "NET_BIND_SERVICE"]}}}]
        }));
        let none = Allowances::default();
        let refusals = pod_refusals(&none, &risky);
        let text = refusals.join("\n");
        for needle in [
            "hostNetwork",
            "hostPID",
            "hostIPC",
            "hostPath",
            "hostPort 80",
            "privileged",
            "SYS_ADMIN",
            "NET_BIND_SERVICE",
            "runc-unsandboxed",
            ".cephfs is not allowed",
            ".gitRepo is not allowed",
            ".clusterTrustBundle is not allowed",
        ] {
            assert!(text.contains(needle), "{needle} missing from:\n{text}");
        }
        let all = Allowances {
            privileged: true,
            host_network: true,
            host_pid: true,
            host_ipc: true,
            host_path: true,
            host_ports: true,
            capabilities: vec!["SYS_ADMIN".into(), "CAP_NET_BIND_SERVICE".into()],
            runtime_classes: vec!["runc-unsandboxed".into()],
            ..Default::default()
        };
        let left = pod_refusals(&all, &risky).join("\n");
        assert!(
            !left.contains("hostPath") && !left.contains("privileged"),
            "{left}"
        );
        assert!(
            left.contains("cephfs") && left.contains("gitRepo"),
            "never allowed: {left}"
        );
        let sneaky = spec(json!({
            "securityContext": {"seccompProfile": {"type": "Unconfined"}, "sysctls": [{"name": "kernel.msgmax", "value": "1"}]},
            "volumes": [{"name": "nfs", "csi": {"driver": "nfs.csi.k8s.io", "volumeAttributes": {"server": "filer"}}}],
            "containers": [{"name": "c",
                "readinessProbe": {"tcpSocket": {"host": "10.96.0.1", "port": 443}},
                "lifecycle": {"postStart": {"httpGet": {"host": "169.254.169.254", "path": "/", "port": 80}}},
                "securityContext": {"seLinuxOptions": {"type": "spc_t"}, "appArmorProfile": {"type": "Unconfined"}}}]
        }));
        let text = pod_refusals(&none, &sneaky).join("\n");
        for needle in [
            "seccomp",
            "kernel.msgmax",
            "nfs.csi.k8s.io",
            "readinessProbe.tcpSocket",
            "169.254.169.254",
            "SELinux",
            "AppArmor",
        ] {
            assert!(text.contains(needle), "{needle} missing from:\n{text}");
        }
        let opened = Allowances {
            privileged: true,
            csi_drivers: vec!["nfs.csi.k8s.io".into()],
            ..Default::default()
        };
        let left = pod_refusals(&opened, &sneaky).join("\n");
        assert!(
            left.contains("169.254.169.254") && !left.contains("seccomp") && !left.contains("nfs"),
            "probes never: {left}"
        );
        let plain = spec(json!({"containers": [{"name": "c"}],
            "volumes": [{"name": "e", "emptyDir": {}}, {"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]}));
        assert!(pod_refusals(&none, &plain).is_empty());
    }

    #[test]
    fn localhost_profiles_are_only_the_listed_ones() {
        let pod = spec(json!({
            "securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/unconfined.json"}},
            "containers": [{"name": "c", "securityContext": {
                "appArmorProfile": {"type": "Localhost", "localhostProfile": "k8s-apparmor-example-deny-write"}}}]
        }));
        let text = pod_refusals(&Allowances::default(), &pod).join("\n");
        assert!(
            text.contains("the pod: seccomp Localhost profile \"profiles/unconfined.json\" is not in the IsolationProfile's allow.localhostProfiles, which is empty"),
            "{text}"
        );
        assert!(
            text.contains("container \"c\": AppArmor Localhost profile"),
            "{text}"
        );
        let listed = Allowances {
            localhost_profiles: vec![
                "profiles/unconfined.json".into(),
                "k8s-apparmor-example-deny-write".into(),
            ],
            ..Default::default()
        };
        assert!(pod_refusals(&listed, &pod).is_empty());
    }

    /// Moved from `images`' tests: a pod's refusals include those of its images.
    #[test]
    fn a_pods_refusals_include_its_images() {
        let pod = crate::allow::images::tests::pod_of_four_registries();
        let allow = Allowances {
            image_registries: Some(vec!["ghcr.io".into()]),
            ..Default::default()
        };
        let deployer = &crate::allow::images::image_refusals(&allow, &pod)[1];
        assert!(deployer.starts_with("container \"deployer\""), "{deployer}");
        assert!(pod_refusals(&allow, &pod).contains(deployer));
    }
}
