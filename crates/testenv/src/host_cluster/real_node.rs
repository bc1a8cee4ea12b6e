//! A real node beside the control plane: containerd with runc, the CNI bridge, the kubelet and
//! kube-proxy in nftables mode, pulling images from a registry on loopback that serves the images
//! `testenv/images.sh` built. Pods on it run real processes with real addresses.
//!
//! It runs in the network namespace of the process that starts it, which must be one of its own
//! with no way out ([`preflight`]): `unshare --net` with only loopback up, as `make test` and
//! `tenantplane dev` arrange. One real node per namespace (its bridge and nftables tables are the
//! namespace's).

mod cgroups;
pub mod config;
mod preflight;

pub use preflight::{Unfit, isolated, machine_allows, preflight};

use std::path::{Path, PathBuf};
use std::process::Command;

use tenantplane_pki::{CertificateAuthority, Leaf};

use super::pki::write;
use super::{ControlPlane, HOST_PATH_VOLUMES, KWOK_NODE};
use crate::process::free_port;
use crate::{Error, Result, kubeconfig};
pub use config::{BRIDGE, NODE_IP, POD_CIDR};

/// The real node's name.
pub const NODE_NAME: &str = "tenantplane-node-0";

static RUNNING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Does a real node run in this process (so pod IPs are dialled)?
pub fn running() -> bool {
    RUNNING.load(std::sync::atomic::Ordering::SeqCst)
}

/// The address the operator of a test has on the real node's network, as a pod IP would be
/// (on loopback, beside the local runtime's pod IPs, which are `10.245.<port>` for loopback
/// ports above 1023): sleeping tenants' API Services lead to its wake doors there.
pub const OPERATOR_IP: &str = "10.245.0.2";

/// Put [`OPERATOR_IP`] on loopback (idempotent); the address.
pub fn operator_address() -> Result<std::net::IpAddr> {
    run(
        "ip",
        &["addr", "replace", &format!("{OPERATOR_IP}/32"), "dev", "lo"],
    )?;
    OPERATOR_IP
        .parse()
        .map_err(|e| Error::Io(format!("{OPERATOR_IP}: {e}")))
}

/// What a running real node leaves to clean up, and where its registry is.
#[derive(Debug)]
pub(super) struct RealNodeState {
    pub registry: String,
    cgroup_root: String,
    containerd_socket: PathBuf,
}

impl RealNodeState {
    /// Once its processes are stopped: kill the shims and what runs in its cgroups, and remove them.
    pub(super) fn clean_up(&self) {
        RUNNING.store(false, std::sync::atomic::Ordering::SeqCst);
        cgroups::kill_shims(&self.containerd_socket);
        cgroups::remove(&self.cgroup_root);
        stop_steering();
    }
}

/// Run `ip` (or any tool) and fail with its output.
pub fn run(program: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| Error::Io(format!("running {program}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Io(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// The node's network, before the API server starts (it advertises the node's address): loopback
/// up, the pod bridge with [`NODE_IP`] and the Service range routed to it, forwarding on and bridged traffic through netfilter (so
/// kube-proxy's rules see a reply from a pod on the same bridge), all in this namespace only.
pub(super) fn prepare_network() -> Result<()> {
    run("ip", &["link", "set", "lo", "up"])?;
    let devices = std::fs::read_to_string("/proc/self/net/dev")?;
    if !devices
        .lines()
        .any(|l| l.trim_start().starts_with(&format!("{BRIDGE}:")))
    {
        run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
    }
    let address = format!("{NODE_IP}/{}", config::POD_PREFIX);
    run("ip", &["addr", "replace", &address, "dev", BRIDGE])?;
    run("ip", &["link", "set", BRIDGE, "up"])?;
    // A node killed in this namespace left its steering behind, with no enforcer to read the
    // queue: every pod's packets would be dropped (the cluster DNS would never be ready).
    stop_steering();
    // The Service range through the bridge, so this namespace's own processes (API servers
    // calling webhooks, the tests) reach Service addresses: kube-proxy's DNAT comes after the
    // route lookup, which fails without one ("network is unreachable"). Pods route through
    // the bridge already.
    run(
        "ip",
        &["route", "replace", super::SERVICE_CIDR, "dev", BRIDGE],
    )?;
    for (key, value) in [
        ("net/ipv4/ip_forward", "1"),
        ("net/bridge/bridge-nf-call-iptables", "1"),
        ("net/ipv4/conf/all/route_localnet", "1"),
    ] {
        let path = Path::new("/proc/sys").join(key);
        std::fs::write(&path, value)
            .map_err(|e| Error::Io(format!("setting {}: {e}", path.display())))?;
    }
    Ok(())
}

/// The images' OCI layouts: the test world's, built by `testenv/images.sh`, and the operator's own
/// image (which holds the snapshot agent) from the `tenantplane` binary the runtime runs, built by
/// `testenv/agent-image.sh` (both cached; seconds when nothing changed).
fn images(binaries: &crate::Binaries) -> Result<Vec<PathBuf>> {
    let mut layouts = vec![layout_from(
        "testenv/images.sh",
        &[binaries.dir().as_os_str()],
    )?];
    if let Some(agent) = binaries.agent() {
        layouts.push(layout_from(
            "testenv/agent-image.sh",
            &[
                binaries.dir().as_os_str(),
                agent.binary.as_os_str(),
                std::ffi::OsStr::new(&agent.image),
            ],
        )?);
    }
    Ok(layouts)
}

/// Run image script `script` with `args`: the layout folder it prints.
fn layout_from(script: &str, args: &[&std::ffi::OsStr]) -> Result<PathBuf> {
    let script = crate::repo_path(script);
    let out = Command::new("bash")
        .arg(&script)
        .args(args)
        .output()
        .map_err(|e| Error::Io(format!("running {}: {e}", script.display())))?;
    if !out.status.success() {
        return Err(Error::NotBuilt(format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// A kubeconfig for a component, with a client certificate for `user` in `groups`.
fn component_kubeconfig(
    plane: &ControlPlane,
    ca: &CertificateAuthority,
    user: &str,
    groups: &[&str],
    path: &Path,
) -> Result<()> {
    let cert = ca.issue(&Leaf::client(user, groups))?;
    write(
        path,
        &kubeconfig::render(
            user,
            &plane.server,
            ca.cert_pem(),
            &cert.cert_pem,
            &cert.key_pem,
        )?,
    )
}

impl ControlPlane {
    /// Start the real node's parts and wait until it is Ready; then taint the simulated node with
    /// `simulated_taint` (see [`super::Nodes::Real`]).
    ///
    /// Over 100 lines as a start-up script in the order a node comes up (registry, mounts,
    /// cgroups, containerd, the kubelet, kube-proxy, the network policies, cluster DNS), each
    /// step using what the ones before made.
    pub(super) fn start_real_node(
        &mut self,
        ca: &CertificateAuthority,
        simulated_taint: &str,
        say: &dyn Fn(&str),
    ) -> Result<()> {
        let node_dir = self.dir.join("node");
        let dirs = [
            "containerd",
            "certs.d",
            "net.d",
            "kubelet",
            "volume-plugins",
            "kube-proxy",
        ];
        for d in dirs {
            std::fs::create_dir_all(node_dir.join(d))?;
        }
        let bin = self.binaries.dir().to_path_buf();
        let path_env = format!(
            "{}:/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin",
            bin.display()
        );

        say("starting the registry with the test world's images");
        let layouts = images(&self.binaries)?;
        let registry_port = free_port()?;
        let registry = format!("127.0.0.1:{registry_port}");
        let mut args = vec!["serve".to_string(), format!("--address={registry}")];
        args.extend(layouts.iter().map(|l| format!("--layout={}", l.display())));
        self.spawn("registry", args, &[])?;
        let log = self.log_path("registry");
        self.wait_until("the registry to load its images", || {
            Ok(std::fs::read_to_string(&log).is_ok_and(|l| l.contains("ready ")))
        })?;
        for upstream in config::MIRRORED_REGISTRIES {
            let d = node_dir.join("certs.d").join(upstream);
            std::fs::create_dir_all(&d)?;
            write(
                &d.join("hosts.toml"),
                &config::hosts_toml(upstream, &registry),
            )?;
        }

        // The kubelet checks machine-wide kernel settings: show it the values it wants, in the
        // node's own mount namespace, rather than let it change them for the machine.
        let mut binds = Vec::new();
        let kernel_dir = node_dir.join("kernel-defaults");
        std::fs::create_dir_all(&kernel_dir)?;
        for (key, value) in config::KERNEL_DEFAULTS {
            let file = kernel_dir.join(key.replace('/', "."));
            write(&file, &format!("{value}\n"))?;
            binds.push((file, Path::new("/proc/sys").join(key)));
        }
        // libcni keeps each attachment's result under /var/lib/cni, a path containerd cannot
        // change: the node's own folder goes over it there, so nothing of the node's is left in
        // the machine's (which keeps at most the empty folder, made once as the mount point).
        let cni_cache = node_dir.join("cni-cache");
        std::fs::create_dir_all(&cni_cache)?;
        std::fs::create_dir_all(LIBCNI_CACHE)
            .map_err(|e| Error::Io(format!("creating {LIBCNI_CACHE}: {e}")))?;
        binds.push((cni_cache, PathBuf::from(LIBCNI_CACHE)));
        crate::process::private_mounts(binds)
            .map_err(|e| Error::Io(format!("the node's mount namespace: {e}")))?;
        let socket = node_dir.join("containerd").join("containerd.sock");
        // Shims of a node that was killed with this folder outlive it (they belong to no cgroup of
        // the node's): theirs go before the node starts again; its containers go with its cgroups.
        cgroups::kill_shims(&socket);
        let cgroup_root = cgroups::create(&node_dir)?;
        self.real_node = Some(RealNodeState {
            registry,
            cgroup_root: cgroup_root.clone(),
            containerd_socket: socket.clone(),
        });

        say("starting containerd");
        let containerd_dir = node_dir.join("containerd");
        write(
            &node_dir.join("net.d/10-tenantplane.conflist"),
            &config::cni_conflist(&node_dir.join("ipam")),
        )?;
        let containerd_config = node_dir.join("containerd.toml");
        write(
            &containerd_config,
            &config::containerd(
                &containerd_dir,
                &bin,
                &node_dir.join("net.d"),
                &node_dir.join("certs.d"),
            ),
        )?;
        self.spawn(
            "containerd",
            vec![format!("--config={}", containerd_config.display())],
            &[("PATH", path_env.as_str())],
        )?;
        self.wait_until("containerd's socket", || Ok(socket.exists()))?;

        say("starting the kubelet");
        let kubelet_kc = node_dir.join("kubelet.kubeconfig");
        component_kubeconfig(
            self,
            ca,
            &format!("system:node:{NODE_NAME}"),
            &["system:nodes"],
            &kubelet_kc,
        )?;
        // The node's resolver (pods with dnsPolicy Default, and where CoreDNS forwards what is not
        // the cluster's): the node's own address, where nothing answers port 53, so a lookup of
        // an outside name fails at once and never reaches a resolver of the machine.
        let resolv = node_dir.join("resolv.conf");
        write(&resolv, &format!("nameserver {NODE_IP}\n"))?;
        let kubelet_config = node_dir.join("kubelet.yaml");
        write(
            &kubelet_config,
            &config::kubelet(
                &config::KubeletPaths {
                    ca: &self.dir.join("ca.crt"),
                    pod_logs: &node_dir.join("pod-logs"),
                    containerd_socket: &socket,
                    resolv_conf: &resolv,
                    volume_plugins: &node_dir.join("volume-plugins"),
                },
                &cgroup_root,
                10250,
                free_port()?,
                CLUSTER_DNS,
            ),
        )?;
        let kubelet_dir = node_dir.join("kubelet");
        self.spawn(
            "kubelet",
            vec![
                format!("--config={}", kubelet_config.display()),
                format!("--kubeconfig={}", kubelet_kc.display()),
                format!("--root-dir={}", kubelet_dir.display()),
                format!("--cert-dir={}", kubelet_dir.join("pki").display()),
                format!("--hostname-override={NODE_NAME}"),
                format!("--node-ip={NODE_IP}"),
                "--v=1".into(),
            ],
            &[("PATH", path_env.as_str())],
        )?;

        say("starting kube-proxy (nftables)");
        let proxy_kc = node_dir.join("kube-proxy.kubeconfig");
        component_kubeconfig(self, ca, "system:kube-proxy", &[], &proxy_kc)?;
        let proxy_config = node_dir.join("kube-proxy.yaml");
        write(
            &proxy_config,
            &config::kube_proxy(&proxy_kc, NODE_NAME, free_port()?, free_port()?),
        )?;
        self.spawn(
            "kube-proxy",
            vec![format!("--config={}", proxy_config.display())],
            &[("PATH", path_env.as_str())],
        )?;

        say("waiting for the real node to be Ready");
        self.wait_for_node("the real node", NODE_NAME)?;
        self.kubectl_ok(&[
            "taint",
            "node",
            KWOK_NODE,
            &format!("{simulated_taint}=true:NoSchedule"),
            "--overwrite",
        ])?;
        RUNNING.store(true, std::sync::atomic::Ordering::SeqCst);
        open_host_path_volumes();

        say("starting the cluster DNS (CoreDNS, Service kube-system/kube-dns)");
        let dns = node_dir.join("cluster-dns.yaml");
        write(&dns, CLUSTER_DNS_YAML)?;
        self.kubectl_ok(&["apply", "-f", &dns.display().to_string()])?;
        self.wait_for_one_ready("the cluster DNS", "deployment/coredns", "readyReplicas")?;

        say("starting the NetworkPolicy enforcer (kube-network-policies)");
        let enforcer = node_dir.join("network-policies.yaml");
        write(&enforcer, NETWORK_POLICIES_YAML)?;
        self.kubectl_ok(&["apply", "-f", &enforcer.display().to_string()])?;
        self.wait_for_one_ready(
            "the NetworkPolicy enforcer",
            "daemonset/kube-network-policies",
            "numberReady",
        )?;
        // Ready is "its container runs"; its queue is bound a moment later (the kernel lists it).
        self.wait_until("the NetworkPolicy enforcer's queue", || {
            let queues = std::fs::read_to_string("/proc/self/net/netfilter/nfnetlink_queue")
                .unwrap_or_default();
            Ok(queues
                .lines()
                .any(|l| l.split_whitespace().next() == Some(ENFORCER_QUEUE)))
        })?;
        steer_to_the_enforcer()?;
        Ok(())
    }
}

impl ControlPlane {
    /// Wait until `object` of kube-system (`kind/name`) counts one ready pod in status `field`.
    fn wait_for_one_ready(&self, what: &str, object: &str, field: &str) -> Result<()> {
        self.wait_until(&format!("{what} to be ready"), || {
            let out = self.kubectl_output(&[
                "get",
                object,
                "-n",
                "kube-system",
                "-o",
                &format!("jsonpath={{.status.{field}}}"),
            ]);
            Ok(out.is_ok_and(|s| s.trim() == "1"))
        })
    }
}

/// The NetworkPolicy enforcer: kube-network-policies' DaemonSet and RBAC (see the file's header
/// for how it differs from upstream's manifest).
const NETWORK_POLICIES_YAML: &str = include_str!("real_node/network_policies.yaml");

/// The netfilter queue the enforcer reads (its `--nfqueue-id`).
const ENFORCER_QUEUE: &str = "100";

/// Where libcni caches results, whatever its caller says.
const LIBCNI_CACHE: &str = "/var/lib/cni";

/// The chain that sends pods' new connections to the enforcer.
const STEERING_CHAIN: &str = "TENANTPLANE-NETPOL";

/// Empty the steering chain, if there is one: the jumps to it then decide nothing.
fn stop_steering() {
    let _ = run(
        "iptables-nft",
        &["-w", "-t", "mangle", "-F", STEERING_CHAIN],
    );
}

/// Send the first packet of every pod connection to the enforcer's queue, where it decides by the
/// NetworkPolicies: kube-network-policies' own rules do that with nftables' `queue` expression,
/// which this kernel lacks (CONFIG_NFT_QUEUE), so its rule set never loads. The same steering
/// through the xtables NFQUEUE target (iptables-nft) reaches the same queue. Like its rules:
/// established and related packets and the node's root processes (kubelet probes) pass, and
/// nothing passes while the enforcer is down (no bypass). Unlike them, everything a pod sends or
/// receives is queued (it lists only pods that policies select: a verdict for the others is
/// "allow"), and so is what a pod sends to an address of the node itself (INPUT): in this test
/// world the host's API server, the operator and the tenants' control planes listen on the
/// node, where in a cluster they are other machines or pods, and the policies must hold for them
/// too. Idempotent: a dev cluster restarted in the same namespace finds the chain and refills it.
fn steer_to_the_enforcer() -> Result<()> {
    let iptables = |args: &[&str]| {
        let mut all = vec!["-w", "-t", "mangle"];
        all.extend_from_slice(args);
        run("iptables-nft", &all)
    };
    if iptables(&["-N", STEERING_CHAIN]).is_err() {
        iptables(&["-F", STEERING_CHAIN])?;
    }
    iptables(&[
        "-A",
        STEERING_CHAIN,
        "-m",
        "conntrack",
        "--ctstate",
        "ESTABLISHED,RELATED",
        "-j",
        "RETURN",
    ])?;
    iptables(&[
        "-A",
        STEERING_CHAIN,
        "-j",
        "NFQUEUE",
        "--queue-num",
        ENFORCER_QUEUE,
    ])?;
    let cidr = config::POD_CIDR;
    // Packets of sockets owned by root (the kubelet, the control plane) are not a pod's.
    let not_root = ["-m", "owner", "!", "--uid-owner", "0"];
    let jumps: [Vec<&str>; 3] = [
        // From a pod, to anywhere (forwarded, or bridged to a pod beside it).
        [&["POSTROUTING", "-s", cidr][..], &not_root].concat(),
        // To a pod, from anywhere.
        [&["POSTROUTING", "-d", cidr][..], &not_root].concat(),
        // From a pod to an address of the node.
        vec!["INPUT", "-i", BRIDGE, "-s", cidr],
    ];
    for jump in jumps {
        let mut rule = jump;
        rule.extend_from_slice(&["-j", STEERING_CHAIN]);
        let mut check = vec!["-C"];
        check.extend_from_slice(&rule);
        if iptables(&check).is_err() {
            let mut add = vec!["-A"];
            add.extend_from_slice(&rule);
            iptables(&add)?;
        }
    }
    Ok(())
}

/// The host's cluster DNS: CoreDNS as a Deployment in kube-system, its RBAC and Service kube-dns
/// at [`CLUSTER_DNS`], as a conformant cluster has it. Its image is the tenants' CoreDNS image
/// (the syncer's), which `testenv/images.sh` builds; `tenantplane-local`, which sees both, checks
/// they agree.
pub const CLUSTER_DNS_YAML: &str = include_str!("real_node/cluster_dns.yaml");

/// The cluster DNS Service's address, the kubelet's `clusterDNS`.
pub const CLUSTER_DNS: &str = "10.96.0.10";

/// The host-path provisioner makes each volume root's and 0750, and a host-path volume takes no
/// `fsGroup`, so a pod running as a user of its own (a `kubernetes` tenant's control plane, as
/// 10001) could not write its claim. Clusters' usual provisioners give such pods a writable
/// volume: CSI drivers apply `fsGroup`, and local-path (k3s's, kind's) makes each folder 0777. The
/// test world does what local-path does, for every volume as it appears.
fn open_host_path_volumes() {
    use std::os::unix::fs::PermissionsExt;
    std::thread::spawn(|| {
        while RUNNING.load(std::sync::atomic::Ordering::SeqCst) {
            for entry in std::fs::read_dir(HOST_PATH_VOLUMES)
                .into_iter()
                .flatten()
                .flatten()
            {
                let open = entry
                    .metadata()
                    .is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o777 == 0o777);
                if !open {
                    let _ = std::fs::set_permissions(
                        entry.path(),
                        std::fs::Permissions::from_mode(0o777),
                    );
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster_dns_objects() -> Vec<serde_yaml::Value> {
        serde_yaml::Deserializer::from_str(CLUSTER_DNS_YAML)
            .map(|d| serde::Deserialize::deserialize(d).expect("YAML"))
            .collect()
    }

    fn object<'a>(all: &'a [serde_yaml::Value], kind: &str) -> &'a serde_yaml::Value {
        all.iter()
            .find(|o| o["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind}"))
    }

    #[test]
    fn the_cluster_dns_answers_at_the_kubelets_address() {
        let all = cluster_dns_objects();
        let service = object(&all, "Service");
        assert_eq!(service["metadata"]["name"], "kube-dns");
        assert_eq!(service["metadata"]["namespace"], "kube-system");
        assert_eq!(service["spec"]["clusterIP"], CLUSTER_DNS);
        let pod = &object(&all, "Deployment")["spec"]["template"]["spec"];
        assert!(pod["containers"][0]["image"].is_string(), "{pod:?}");
        // CoreDNS asks the node's resolver, where nothing answers, for what is not the cluster's.
        assert_eq!(pod["dnsPolicy"], "Default");
        let corefile = object(&all, "ConfigMap")["data"]["Corefile"]
            .as_str()
            .expect("Corefile");
        assert!(
            corefile.contains("forward . /etc/resolv.conf"),
            "{corefile}"
        );
        assert!(corefile.contains("kubernetes cluster.local"), "{corefile}");
        let role = object(&all, "ClusterRoleBinding");
        assert_eq!(role["subjects"][0]["name"], "coredns");
    }
}
