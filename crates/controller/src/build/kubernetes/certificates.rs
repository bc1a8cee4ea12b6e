//! The certificates k3s would make for itself at start, which the operator issues for the
//! `kubernetes` distribution's components into Secret `<name>-control-plane-certs`, and when they
//! must be issued again.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use tenantplane_api::TenantCluster;
use tenantplane_pki::{KeyAndCert, Leaf};

use super::{cert, pki};
use crate::build::BuildOptions;
use crate::build::layout::Addressing;
use crate::build::meta::{identity, owned_metadata};
use crate::tenant_pki::{self, PkiError, TenantPki};
use crate::{Error, names};

/// The certificates Secret's files.
pub const SERVING_CRT: &str = "apiserver.crt";
/// The serving certificate's key.
pub const SERVING_KEY: &str = "apiserver.key";
/// kube-apiserver's client certificate for kubelets (`--kubelet-client-certificate`).
pub const KUBELET_CLIENT_CRT: &str = "apiserver-kubelet-client.crt";
/// The kubelet client certificate's key.
pub const KUBELET_CLIENT_KEY: &str = "apiserver-kubelet-client.key";
/// kube-apiserver's client certificate for aggregated API servers (`--proxy-client-cert-file`).
pub const FRONT_PROXY_CRT: &str = "front-proxy-client.crt";
/// The front-proxy client certificate's key.
pub const FRONT_PROXY_KEY: &str = "front-proxy-client.key";
/// kube-controller-manager's client certificate.
pub const CONTROLLER_MANAGER_CRT: &str = "controller-manager.crt";
/// kube-controller-manager's client key.
pub const CONTROLLER_MANAGER_KEY: &str = "controller-manager.key";
/// kube-controller-manager's kubeconfig, naming its certificate, its key and the tenant CA.
pub const CONTROLLER_MANAGER_KUBECONFIG: &str = "controller-manager.kubeconfig";
/// The operator's kubelet endpoint's CA, which kube-apiserver checks virtual Nodes' kubelet
/// against.
pub const KUBELET_CA_CRT: &str = "kubelet-ca.crt";
/// The Secret's annotation with a digest of what its certificates were issued for (the serving
/// names and the kubelet CA): when that changes they are issued again.
pub const ANNOTATION_ISSUED_FOR: &str = "tenantplane.io/issued-for";

/// The front proxy's client name, the one the API server accepts request headers from.
pub(super) const FRONT_PROXY_NAME: &str = "front-proxy-client";
/// The API server's name towards kubelets, as the operator's kubelet endpoint expects it
/// (k3s's: a `system:masters` certificate of the client CA).
const KUBELET_CLIENT_NAME: &str = "system:apiserver";
const KUBELET_CLIENT_GROUP: &str = "system:masters";
/// The controller manager's user, which the API server's bootstrap RBAC gives its roles.
const CONTROLLER_MANAGER_USER: &str = "system:kube-controller-manager";

/// Every name the API server answers to: its Services' (which the operator, synced pods and
/// `connect` dial), the API Service's cluster IP, loopback (the controller manager), the
/// in-tenant `kubernetes` Service's names and first address, as k3s's own certificate has them.
pub fn serving_names(tenant: &str, namespace: &str, addressing: &Addressing) -> Vec<String> {
    let mut sans = names::service_dns_names(tenant, namespace);
    sans.push(addressing.api_ip.clone());
    sans.extend(
        [
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "localhost",
            "127.0.0.1",
        ]
        .map(String::from),
    );
    if let Some(first) = crate::service_range::first_address(&addressing.service_cidr) {
        sans.push(first);
    }
    sans
}

/// A digest of what the certificates are issued for: the serving names and the kubelet CA.
fn issued_for(names: &[String], kubelet_ca: Option<&str>) -> String {
    crate::build::meta::digest(
        names
            .iter()
            .map(String::as_str)
            .chain(std::iter::once(kubelet_ca.unwrap_or_default())),
    )
}

/// The controller manager's kubeconfig: the API server on loopback, its certificate by file
/// (so a renewed one is read again without a restart).
fn controller_manager_kubeconfig() -> String {
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "tenant", "cluster": {
            "server": format!("https://127.0.0.1:{}", names::API_PORT),
            "certificate-authority": pki(tenant_pki::SERVER_CA_CRT),
        }}],
        "users": [{"name": CONTROLLER_MANAGER_USER, "user": {
            "client-certificate": cert(CONTROLLER_MANAGER_CRT),
            "client-key": cert(CONTROLLER_MANAGER_KEY),
        }}],
        "contexts": [{"name": "tenant", "context": {"cluster": "tenant", "user": CONTROLLER_MANAGER_USER}}],
        "current-context": "tenant",
    });
    serde_yaml::to_string(&config).unwrap_or_default()
}

/// The certificates the components need, issued now for `validity`, in the Secret the pod
/// mounts at [`CERTS_MOUNT`].
pub fn certificates_secret(
    tc: &TenantCluster,
    pki: &TenantPki,
    addressing: &Addressing,
    options: &BuildOptions,
    validity: std::time::Duration,
) -> Result<Secret, Error> {
    let (tenant, ns) = identity(tc)?;
    let sans = serving_names(&tenant, &ns, addressing);
    let san_refs: Vec<&str> = sans.iter().map(String::as_str).collect();
    let issue = |ca: &tenantplane_pki::CertificateAuthority, leaf: Leaf| {
        ca.issue(&leaf.valid_for(validity)).map_err(PkiError::from)
    };
    let serving = issue(&pki.server_ca, Leaf::server("kube-apiserver", &san_refs))?;
    let kubelet_client = issue(
        &pki.client_ca,
        Leaf::client(KUBELET_CLIENT_NAME, &[KUBELET_CLIENT_GROUP]),
    )?;
    let front_proxy = issue(&pki.request_header_ca, Leaf::client(FRONT_PROXY_NAME, &[]))?;
    let controller_manager = issue(&pki.client_ca, Leaf::client(CONTROLLER_MANAGER_USER, &[]))?;
    let kubelet_ca = options.kubelet.as_ref().map(|k| k.ca_pem.as_str());
    let mut data = BTreeMap::new();
    let mut pair = |crt: &str, key: &str, pair: &KeyAndCert| {
        data.insert(crt.to_string(), pair.cert_pem.clone());
        data.insert(key.to_string(), pair.key_pem.clone());
    };
    pair(SERVING_CRT, SERVING_KEY, &serving);
    pair(KUBELET_CLIENT_CRT, KUBELET_CLIENT_KEY, &kubelet_client);
    pair(FRONT_PROXY_CRT, FRONT_PROXY_KEY, &front_proxy);
    pair(
        CONTROLLER_MANAGER_CRT,
        CONTROLLER_MANAGER_KEY,
        &controller_manager,
    );
    data.insert(
        CONTROLLER_MANAGER_KUBECONFIG.into(),
        controller_manager_kubeconfig(),
    );
    if let Some(ca) = kubelet_ca {
        data.insert(KUBELET_CA_CRT.into(), ca.to_string());
    }
    let mut metadata = owned_metadata(tc, names::control_plane_certs(&tenant))?;
    metadata.annotations = Some(BTreeMap::from([(
        ANNOTATION_ISSUED_FOR.to_string(),
        issued_for(&sans, kubelet_ca),
    )]));
    Ok(Secret {
        metadata,
        type_: Some("Opaque".into()),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Default::default()
    })
}

/// Why the component certificates must be issued again.
#[derive(Debug, thiserror::Error)]
pub enum Reissue {
    /// The tenant has no name or namespace yet.
    #[error("the tenant has no name or namespace")]
    NoIdentity,
    /// The certificates were issued for other serving names or another kubelet CA.
    #[error("issued for other names or another kubelet CA")]
    OtherNames,
    /// A file of the Secret is missing: which.
    #[error("{0} is missing")]
    Missing(String),
    /// A file of the Secret is not UTF-8 PEM: which.
    #[error("{0} is not UTF-8 PEM")]
    NotPem(String),
    /// A certificate is not the tenant CA's, or cannot be read.
    #[error("{file}: {detail}")]
    Unsound {
        /// The file.
        file: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// A private key does not belong to its certificate.
    #[error("{key} does not match {crt}")]
    KeyMismatch {
        /// The key's file.
        key: &'static str,
        /// The certificate's file.
        crt: &'static str,
    },
    /// A certificate has less than the renewal margin left.
    #[error("a certificate is due for renewal")]
    Due,
}

/// Why the certificates in `secret` must be issued again, if they must: a file missing or not
/// signed by the tenant's CA, issued for other names or another kubelet CA, or due (less than
/// `renew_before` seconds left at `now`). Returns also when the soonest is due, when sound.
pub fn certificates_due(
    secret: &Secret,
    tc: &TenantCluster,
    pki: &TenantPki,
    addressing: &Addressing,
    options: &BuildOptions,
    now: i64,
    renew_before: i64,
) -> Result<i64, Reissue> {
    let (tenant, ns) = identity(tc).map_err(|_| Reissue::NoIdentity)?;
    let wanted = issued_for(
        &serving_names(&tenant, &ns, addressing),
        options.kubelet.as_ref().map(|k| k.ca_pem.as_str()),
    );
    let has = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_ISSUED_FOR));
    if has != Some(&wanted) {
        return Err(Reissue::OtherNames);
    }
    let text = |key: &str| -> Result<String, Reissue> {
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| Reissue::Missing(key.to_string()))?;
        String::from_utf8(bytes.0.clone()).map_err(|_| Reissue::NotPem(key.to_string()))
    };
    let mut due_at = i64::MAX;
    for (crt, key, ca) in [
        (SERVING_CRT, SERVING_KEY, &pki.server_ca),
        (KUBELET_CLIENT_CRT, KUBELET_CLIENT_KEY, &pki.client_ca),
        (FRONT_PROXY_CRT, FRONT_PROXY_KEY, &pki.request_header_ca),
        (
            CONTROLLER_MANAGER_CRT,
            CONTROLLER_MANAGER_KEY,
            &pki.client_ca,
        ),
    ] {
        let (cert_pem, key_pem) = (text(crt)?, text(key)?);
        let unsound = |e: tenantplane_pki::Error| Reissue::Unsound {
            file: crt,
            detail: e.to_string(),
        };
        tenantplane_pki::verify_signed_by(&cert_pem, ca.cert_pem()).map_err(unsound)?;
        if !tenantplane_pki::key_matches_certificate(&key_pem, &cert_pem) {
            return Err(Reissue::KeyMismatch { key, crt });
        }
        let lifetime = tenantplane_pki::lifetime(&cert_pem).map_err(unsound)?;
        due_at = due_at.min(lifetime.not_after - renew_before);
    }
    text(CONTROLLER_MANAGER_KUBECONFIG)?;
    if due_at <= now {
        return Err(Reissue::Due);
    }
    Ok(due_at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures::{addressing, kubernetes_tenant, with_kubelet};

    #[test]
    fn certificates_are_issued_for_every_name_and_renewed_when_due() {
        let tc = kubernetes_tenant();
        let pki = TenantPki::generate("dev").unwrap();
        let options = BuildOptions::default();
        let day = std::time::Duration::from_secs(86_400);
        let secret = certificates_secret(&tc, &pki, &addressing(), &options, 30 * day).unwrap();
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("dev-control-plane-certs")
        );
        let text =
            |key: &str| String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap();
        tenantplane_pki::verify_signed_by(&text(SERVING_CRT), pki.server_ca.cert_pem()).unwrap();
        let sans = tenantplane_pki::subject_alt_names(&text(SERVING_CRT)).unwrap();
        for name in [
            "dev.team-dev.svc",
            "10.96.0.10",
            "127.0.0.1",
            "kubernetes.default.svc",
            "10.96.0.1",
        ] {
            assert!(sans.iter().any(|n| n == name), "{name}: {sans:?}");
        }
        assert!(text(CONTROLLER_MANAGER_KUBECONFIG).contains("https://127.0.0.1:6443"));
        let now = jiff_now();
        let due = certificates_due(
            &secret,
            &tc,
            &pki,
            &addressing(),
            &options,
            now,
            10 * 86_400,
        );
        let due = due.expect("fresh certificates are sound");
        assert!(
            due > now + 19 * 86_400 && due <= now + 20 * 86_400 + 60,
            "{due} {now}"
        );
        // Due within the renewal window; another address; another CA's files; a key swapped.
        assert!(
            certificates_due(
                &secret,
                &tc,
                &pki,
                &addressing(),
                &options,
                now,
                31 * 86_400
            )
            .is_err()
        );
        let moved = Addressing {
            api_ip: "10.96.0.11".into(),
            ..addressing()
        };
        assert!(certificates_due(&secret, &tc, &pki, &moved, &options, now, 0).is_err());
        let other = TenantPki::generate("dev").unwrap();
        assert!(
            certificates_due(&secret, &tc, &other, &addressing(), &options, now, 0)
                .unwrap_err()
                .to_string()
                .contains(SERVING_CRT)
        );
        let mut swapped = secret.clone();
        let data = swapped.data.as_mut().unwrap();
        let key = data[FRONT_PROXY_KEY].clone();
        data.insert(SERVING_KEY.into(), key);
        assert!(matches!(
            certificates_due(&swapped, &tc, &pki, &addressing(), &options, now, 0),
            Err(Reissue::KeyMismatch { .. })
        ));
        // A kubelet endpoint later: issued again with its CA.
        let kubelet = with_kubelet(BuildOptions::default());
        assert!(certificates_due(&secret, &tc, &pki, &addressing(), &kubelet, now, 0).is_err());
    }

    fn jiff_now() -> i64 {
        k8s_openapi::jiff::Timestamp::now().as_second()
    }
}
