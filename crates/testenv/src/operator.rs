//! The operator's own identity on the shared test control plane: ServiceAccount
//! `tenantplane-system/tenantplane` as `deploy/operator` installs it, with exactly the rights of
//! its ClusterRole and Role. Tests run the operator with this client, never as an admin, so a
//! permission the code uses and `rbac.yaml` lacks fails them.

use std::sync::OnceLock;

use crate::{kubeconfig, kubectl, repo_path, shared};

/// The operator's namespace and ServiceAccount, as in `deploy/operator`.
pub const NAMESPACE: &str = "tenantplane-system";
/// The operator's ServiceAccount in [`NAMESPACE`].
pub const SERVICE_ACCOUNT: &str = "tenantplane";
/// The user name the API server sees for the operator.
pub const USER: &str = "system:serviceaccount:tenantplane-system:tenantplane";

/// Longer than any test binary runs.
const TOKEN_DURATION: &str = "2h";

/// The files of `deploy/operator` that give the operator its identity and rights.
pub const RBAC_MANIFESTS: &[&str] = &[
    "deploy/operator/namespace.yaml",
    "deploy/operator/serviceaccount.yaml",
    "deploy/operator/rbac.yaml",
];

/// Apply the namespace, ServiceAccount and RBAC of `deploy/operator` to the shared control plane
/// (server-side apply, so again is harmless) and return a token of the ServiceAccount; once per
/// test binary.
pub fn token() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| {
        let mut args = vec![
            "apply".to_string(),
            "--server-side".into(),
            "--force-conflicts".into(),
        ];
        for file in RBAC_MANIFESTS {
            args.push(format!("--filename={}", repo_path(file).display()));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        kubectl(&args).unwrap_or_else(|e| panic!("the operator's RBAC applies: {e}"));
        let token = kubectl(&[
            "create",
            "token",
            SERVICE_ACCOUNT,
            "--namespace",
            NAMESPACE,
            &format!("--duration={TOKEN_DURATION}"),
        ])
        .unwrap_or_else(|e| panic!("a token for the operator's ServiceAccount: {e}"));
        token.trim().to_string()
    })
}

/// The operator's client configuration: the shared control plane, as the ServiceAccount.
pub fn config() -> kube::Config {
    let plane = shared();
    let ca = plane.ca_pem().expect("the control plane's CA");
    kubeconfig::token_config(plane.server(), &ca, token())
        .expect("a client configuration for the operator's ServiceAccount")
}

/// The operator's client. Must be called inside a tokio runtime, which the client is bound to.
pub fn client() -> kube::Client {
    let plane = shared();
    let ca = plane.ca_pem().expect("the control plane's CA");
    kubeconfig::token_client(plane.server(), &ca, token())
        .expect("a client for the operator's ServiceAccount")
}

/// A kubeconfig file for the operator's ServiceAccount, for running the `tenantplane` binary as
/// the operator; written once per test binary.
pub fn kubeconfig_file() -> &'static std::path::Path {
    static FILE: OnceLock<std::path::PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let plane = shared();
        let ca = plane.ca_pem().expect("the control plane's CA");
        let text = kubeconfig::render_token(SERVICE_ACCOUNT, plane.server(), &ca, token())
            .expect("the operator's kubeconfig");
        let path = plane.dir().join("operator.kubeconfig");
        std::fs::write(&path, text).expect("writing the operator's kubeconfig");
        path
    })
}
