//! The command lines of a `kubernetes` tenant's components: kine, kube-apiserver and
//! kube-controller-manager, as k3s runs each, with the operator's certificates.

use super::*;

/// kine as k3s runs it: sqlite in WAL mode at k3s's path, the etcd API on a unix socket, no
/// metrics listener (it would bind every interface without credentials). kine serves no health
/// endpoint; the API server's `/livez` checks the datastore through it.
pub(super) fn kine_args() -> Vec<String> {
    vec![
        format!(
            "--endpoint=sqlite://{DATABASE}?_journal_mode=WAL&_busy_timeout=30000&_synchronous=NORMAL&_txlock=immediate"
        ),
        format!("--listen-address=unix://{KINE_SOCKET_DIR}/kine.sock"),
        "--metrics-bind-address=0".into(),
    ]
}

/// kube-apiserver's flags: what k3s sets for its API server, with the operator's certificates.
/// How long the API server takes to close its watches when it stops: well inside the pod's
/// default termination grace period (30 s), leaving kine, stopped after it, the rest.
const WATCH_DRAIN: &str = "10s";

pub(super) fn apiserver_args(addressing: &Addressing, options: &BuildOptions) -> Vec<String> {
    let mut args = vec![
        format!("--etcd-servers=unix://{KINE_SOCKET_DIR}/kine.sock"),
        format!("--secure-port={}", names::API_PORT),
        format!("--tls-cert-file={}", cert(SERVING_CRT)),
        format!("--tls-private-key-file={}", cert(SERVING_KEY)),
        format!("--client-ca-file={}", pki(tenant_pki::CLIENT_CA_CRT)),
        // As k3s: one key signs service-account tokens and checks them.
        format!(
            "--service-account-key-file={}",
            pki(tenant_pki::SERVICE_KEY)
        ),
        format!(
            "--service-account-signing-key-file={}",
            pki(tenant_pki::SERVICE_KEY)
        ),
        format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
        format!("--service-cluster-ip-range={}", addressing.service_cidr),
        "--authorization-mode=Node,RBAC".into(),
        "--enable-admission-plugins=NodeRestriction".into(),
        format!("--admission-control-config-file={ADMISSION_CONFIG}"),
        "--allow-privileged=true".into(),
        // The syncer writes the tenant's `kubernetes` Endpoints (the host's address for it).
        "--endpoint-reconciler-type=none".into(),
        format!(
            "--requestheader-client-ca-file={}",
            pki(tenant_pki::REQUEST_HEADER_CA_CRT)
        ),
        format!("--requestheader-allowed-names={FRONT_PROXY_NAME}"),
        "--requestheader-username-headers=X-Remote-User".into(),
        "--requestheader-group-headers=X-Remote-Group".into(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        format!("--proxy-client-cert-file={}", cert(FRONT_PROXY_CRT)),
        format!("--proxy-client-key-file={}", cert(FRONT_PROXY_KEY)),
        format!("--kubelet-client-certificate={}", cert(KUBELET_CLIENT_CRT)),
        format!("--kubelet-client-key={}", cert(KUBELET_CLIENT_KEY)),
        "--profiling=false".into(),
        // On SIGTERM, close the open watches (rate-limited over this period) instead of waiting
        // for them to end by themselves: without it the API server outlived the pod's 30 s grace
        // period at every stop (an upgrade, a restore, sleep), and was killed at its end.
        format!("--shutdown-watch-termination-grace-period={WATCH_DRAIN}"),
    ];
    // What counts as use of the tenant, for sleep after idleness.
    args.extend(
        crate::build::audit::apiserver_flags()
            .into_iter()
            .map(|f| format!("--{f}")),
    );
    if options.kubelet.is_some() {
        // As for k3s: virtual Nodes' kubelet is the operator's endpoint, under its own CA, at
        // each Node's Hostname address first.
        args.push(format!(
            "--kubelet-certificate-authority={}",
            cert(KUBELET_CA_CRT)
        ));
        args.push(format!("--{KUBELET_ADDRESS_TYPES}{KUBELET_ADDRESS_ORDER}"));
    }
    args
}

/// kube-controller-manager's flags: k3s's controllers, signing with the client CA as k3s does,
/// its serving certificate made for itself in `/tmp`.
pub(super) fn controller_manager_args(addressing: &Addressing) -> Vec<String> {
    let kubeconfig = cert(CONTROLLER_MANAGER_KUBECONFIG);
    vec![
        format!("--kubeconfig={kubeconfig}"),
        format!("--authentication-kubeconfig={kubeconfig}"),
        format!("--authorization-kubeconfig={kubeconfig}"),
        format!("--secure-port={CONTROLLER_MANAGER_PORT}"),
        "--cert-dir=/tmp/kube-controller-manager".into(),
        // One replica: nothing to elect, and no lease written every few seconds.
        "--leader-elect=false".into(),
        format!("--controllers={}", controllers()),
        "--use-service-account-credentials=true".into(),
        format!(
            "--service-account-private-key-file={}",
            pki(tenant_pki::SERVICE_KEY)
        ),
        format!("--root-ca-file={}", pki(tenant_pki::SERVER_CA_CRT)),
        format!(
            "--cluster-signing-cert-file={}",
            pki(tenant_pki::CLIENT_CA_CRT)
        ),
        format!(
            "--cluster-signing-key-file={}",
            pki(tenant_pki::CLIENT_CA_KEY)
        ),
        format!("--service-cluster-ip-range={}", addressing.service_cidr),
        "--profiling=false".into(),
    ]
}
