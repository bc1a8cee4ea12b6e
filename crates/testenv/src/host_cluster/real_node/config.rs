//! The real node's configuration files, as pure functions of where things are: containerd's
//! config and registry mirrors, the CNI network, the kubelet's and kube-proxy's configurations.

use std::path::Path;

/// The pod network of the real node, the bridge's address (the node's InternalIP) and its name.
pub const POD_CIDR: &str = "10.88.0.0/24";
/// The bridge's address, which is the node's InternalIP.
pub const NODE_IP: &str = "10.88.0.1";
/// The bridge's name.
pub const BRIDGE: &str = "tp-node0";
/// The prefix length of [`POD_CIDR`], for the bridge's address.
pub const POD_PREFIX: u8 = 24;
/// The sandbox image every pod starts with (containerd's default, and what the kubelet pins).
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.2";
/// Registries whose images are served by the local registry (see testenv/images.sh).
pub const MIRRORED_REGISTRIES: &[&str] = &["registry.k8s.io", "docker.io"];

/// The runtime handler the Kubernetes end-to-end suite's RuntimeClass specs expect a node to have.
pub const TEST_HANDLER: &str = "test-handler";

/// containerd 2's configuration (version 3): its own root, state and socket under `dir`, the CRI
/// plugin with runc through the v2 shim and cgroupfs (no systemd here), overlayfs, the CNI
/// plugins from `bin_dir` and registry mirrors from `certs_dir`.
pub fn containerd(dir: &Path, bin_dir: &Path, cni_conf_dir: &Path, certs_dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 3
root = "{d}/root"
state = "{d}/state"
# Plugins this node has no use for (and some need kernel features a test machine may lack).
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
  "io.containerd.nri.v1.nri",
]

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{certs}"

[plugins."io.containerd.cri.v1.runtime"]
  # A test machine may deny lowering a process's OOM score (no CAP_SYS_RESOURCE): keep every
  # container's at or above containerd's own instead of failing the sandbox.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{bin}/runc"
        Root = "{d}/runc"
        SystemdCgroup = false
    # The handler the conformance suite's RuntimeClasses name, as a conformant cluster sets it
    # up: runc again under a second name.
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.{TEST_HANDLER}]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.{TEST_HANDLER}.options]
        BinaryName = "{bin}/runc"
        Root = "{d}/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{bin}"]
    conf_dir = "{cni}"
    max_conf_num = 1
"#,
        bin = bin_dir.display(),
        cni = cni_conf_dir.display(),
        certs = certs_dir.display(),
    )
}

/// `hosts.toml` for one mirrored registry: pull and resolve from the local registry over plain
/// HTTP. The upstream server is named but never reached: nothing routes out of this namespace.
pub fn hosts_toml(upstream: &str, registry: &str) -> String {
    let server = if upstream == "docker.io" {
        "https://registry-1.docker.io".to_string()
    } else {
        format!("https://{upstream}")
    };
    format!(
        r#"server = "{server}"

[host."http://{registry}"]
  capabilities = ["pull", "resolve"]
"#
    )
}

/// The pod network: one bridge, addresses from [`POD_CIDR`], no masquerade (nothing here has
/// anywhere to go), hairpin so a pod reaches itself through a Service, and host ports. The
/// addresses handed out are kept in `ipam_dir`, the node's own: host-local's default is the
/// machine's /var/lib/cni, where every node that was killed before it released its pods'
/// addresses would leave them taken for the next (a conformance run found the range used up).
pub fn cni_conflist(ipam_dir: &Path) -> String {
    serde_json::to_string_pretty(&serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "tenantplane",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                    "dataDir": ipam_dir,
                    "routes": [{"dst": "0.0.0.0/0"}]
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    }))
    .expect("a JSON value serializes")
}

/// Where the kubelet's files are.
pub struct KubeletPaths<'a> {
    /// The client CA the kubelet checks API servers' client certificates against.
    pub ca: &'a Path,
    /// Where the kubelet writes pods' logs.
    pub pod_logs: &'a Path,
    /// containerd's socket.
    pub containerd_socket: &'a Path,
    /// The resolv.conf the kubelet gives pods.
    pub resolv_conf: &'a Path,
    /// Where the kubelet looks for volume plugins.
    pub volume_plugins: &'a Path,
}

/// The kubelet's configuration. On cgroup v1 (which some test machines have), with cgroupfs,
/// certificate and webhook authentication and webhook authorization (a pod cannot use the
/// kubelet's API), eviction thresholds low enough for a shared disk, and no image GC.
///
/// `protectKernelDefaults` is on: a kubelet that finds the kernel's panic and overcommit settings
/// other than it wants would otherwise change them for the whole machine; [`KERNEL_DEFAULTS`]
/// shows it what it wants, in the node's own mount namespace.
pub fn kubelet(
    p: &KubeletPaths,
    cgroup_root: &str,
    port: u16,
    healthz_port: u16,
    cluster_dns: &str,
) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
protectKernelDefaults: true
podLogsDir: {logs}
containerRuntimeEndpoint: unix://{socket}
address: {NODE_IP}
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
clusterDomain: cluster.local
clusterDNS: [{cluster_dns}]
resolvConf: {resolv}
failSwapOn: false
rotateCertificates: false
serializeImagePulls: false
registerNode: true
volumePluginDir: {plugins}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
  imagefs.inodesFree: 1%
evictionPressureTransitionPeriod: 10s
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
shutdownGracePeriod: 0s
"#,
        socket = p.containerd_socket.display(),
        ca = p.ca.display(),
        logs = p.pod_logs.display(),
        resolv = p.resolv_conf.display(),
        plugins = p.volume_plugins.display(),
    )
}

/// The machine-wide kernel settings a kubelet checks (`protectKernelDefaults`), with the values it
/// wants: the node's mount namespace shows it these instead of the machine's, so it neither
/// changes them nor refuses to start.
pub const KERNEL_DEFAULTS: &[(&str, &str)] = &[
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// kube-proxy in nftables mode. It leaves the conntrack sysctls alone (a network namespace may
/// not own them) and serves its health and metrics on loopback.
pub fn kube_proxy(kubeconfig: &Path, node: &str, healthz_port: u16, metrics_port: u16) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: {kc}
hostnameOverride: {node}
clusterCIDR: {POD_CIDR}
healthzBindAddress: 127.0.0.1:{healthz_port}
metricsBindAddress: 127.0.0.1:{metrics_port}
nodePortAddresses: [primary]
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
"#,
        kc = kubeconfig.display(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_keeps_everything_under_its_folder() {
        let text = containerd(
            Path::new("/n/containerd"),
            Path::new("/bin-dir"),
            Path::new("/n/net.d"),
            Path::new("/n/certs.d"),
        );
        let value: toml::Table = text.parse().expect("containerd's config is TOML");
        assert_eq!(value["version"].as_integer(), Some(3));
        assert_eq!(value["root"].as_str(), Some("/n/containerd/root"));
        assert_eq!(
            value["grpc"]["address"].as_str(),
            Some("/n/containerd/containerd.sock")
        );
        let runtime = &value["plugins"]["io.containerd.cri.v1.runtime"];
        let runc = &runtime["containerd"]["runtimes"]["runc"]["options"];
        assert_eq!(runc["SystemdCgroup"].as_bool(), Some(false));
        assert_eq!(runc["BinaryName"].as_str(), Some("/bin-dir/runc"));
        let handler = &runtime["containerd"]["runtimes"][TEST_HANDLER];
        assert_eq!(
            handler["runtime_type"].as_str(),
            Some("io.containerd.runc.v2")
        );
        assert_eq!(
            handler["options"]["BinaryName"].as_str(),
            Some("/bin-dir/runc")
        );
        assert_eq!(runtime["cni"]["conf_dir"].as_str(), Some("/n/net.d"));
        let images = &value["plugins"]["io.containerd.cri.v1.images"];
        assert_eq!(
            images["pinned_images"]["sandbox"].as_str(),
            Some(PAUSE_IMAGE)
        );
        assert_eq!(
            images["registry"]["config_path"].as_str(),
            Some("/n/certs.d")
        );
    }

    #[test]
    fn mirrors_pull_over_plain_http_from_the_local_registry() {
        let text = hosts_toml("registry.k8s.io", "127.0.0.1:5000");
        let value: toml::Table = text.parse().expect("hosts.toml is TOML");
        assert_eq!(value["server"].as_str(), Some("https://registry.k8s.io"));
        let caps = value["host"]["http://127.0.0.1:5000"]["capabilities"]
            .as_array()
            .expect("capabilities");
        assert_eq!(caps.len(), 2);
        assert!(hosts_toml("docker.io", "r").contains("registry-1.docker.io"));
    }

    #[test]
    fn the_pod_network_never_masquerades() {
        let v: serde_json::Value =
            serde_json::from_str(&cni_conflist(Path::new("/n/ipam"))).expect("JSON");
        let bridge = &v["plugins"][0];
        assert_eq!(bridge["ipMasq"], false);
        assert_eq!(bridge["bridge"], BRIDGE);
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], POD_CIDR);
        assert_eq!(bridge["ipam"]["ranges"][0][0]["gateway"], NODE_IP);
        assert_eq!(
            bridge["ipam"]["dataDir"], "/n/ipam",
            "the node's own, not the machine's"
        );
    }

    #[test]
    fn the_kubelet_authenticates_and_authorizes_every_caller() {
        let text = kubelet(
            &KubeletPaths {
                ca: Path::new("/ca.crt"),
                pod_logs: Path::new("/logs"),
                containerd_socket: Path::new("/c.sock"),
                resolv_conf: Path::new("/resolv.conf"),
                volume_plugins: Path::new("/plugins"),
            },
            "/tenantplane/x",
            10250,
            10248,
            "10.96.0.10",
        );
        let v: serde_yaml::Value = serde_yaml::from_str(&text).expect("YAML");
        assert_eq!(v["authentication"]["anonymous"]["enabled"], false);
        assert_eq!(v["authorization"]["mode"], "Webhook");
        assert_eq!(v["readOnlyPort"], 0);
        assert_eq!(v["failCgroupV1"], false);
        assert_eq!(v["protectKernelDefaults"], true);
        assert_eq!(v["cgroupRoot"], "/tenantplane/x");
        assert_eq!(v["cgroupDriver"], "cgroupfs");
        assert_eq!(v["containerRuntimeEndpoint"], "unix:///c.sock");
    }

    #[test]
    fn kube_proxy_runs_nftables_and_leaves_sysctls_alone() {
        let v: serde_yaml::Value =
            serde_yaml::from_str(&kube_proxy(Path::new("/kc"), "n", 1, 2)).expect("YAML");
        assert_eq!(v["mode"], "nftables");
        assert_eq!(v["conntrack"]["maxPerCore"], 0);
        assert_eq!(v["hostnameOverride"], "n");
    }
}
