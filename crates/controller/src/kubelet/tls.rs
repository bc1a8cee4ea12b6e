//! The kubelet endpoint's TLS: a serving certificate from the operator's kubelet CA (the one every
//! tenant API server is told to trust for its kubelets), renewed long before it expires; and a
//! client check that admits only a tenant API server, by a certificate its tenant's client CA
//! signed for `system:masters`, as k3s issues its kubelet client certificate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use tenantplane_pki::{CertificateAuthority, Leaf};

use crate::names;
use crate::tenant_pki::CLIENT_CA_CRT;

/// How long a serving certificate lives, and how often a fresh one is issued.
pub const SERVING_VALIDITY: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often a fresh serving certificate is issued, well before the current one expires.
pub const SERVING_RENEWAL: Duration = Duration::from_secs(24 * 3600);

/// The organisation a tenant API server's kubelet client certificate carries.
const API_SERVER_GROUP: &str = "system:masters";

/// The crypto provider of every TLS configuration here: rustls's ring one.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The serving certificate, swapped for a fresh one by [`Serving::renew`].
pub struct Serving {
    common_name: String,
    ca: CertificateAuthority,
    names: Vec<String>,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
}

/// A serving certificate that could not be made: which, and what failed.
#[derive(Debug, thiserror::Error)]
#[error("{what} for {common_name}: {detail}")]
pub struct CertError {
    common_name: String,
    what: &'static str,
    detail: String,
}

/// Why a client's certificate is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No tenant's client CA signed the certificate (the kubelet endpoint's check).
    #[error("the client certificate is not signed by any tenant's client CA")]
    UnknownSigner,
    /// The tenant's client CA did not sign the certificate (the snapshot agent's check): why.
    #[error("the client certificate is not the tenant client CA's: {0}")]
    NotSignedBy(String),
    /// The certificate is expired or not yet valid.
    #[error("the client certificate{} is not valid now", owner.as_deref().map(|t| format!(" of tenant {t}")).unwrap_or_default())]
    NotValidNow {
        /// The tenant it names, when known.
        owner: Option<String>,
    },
    /// A certificate of the tenant's client CA that is not its API server's.
    #[error(
        "the client certificate {common_name:?} of tenant {tenant} is not its API server's (no {API_SERVER_GROUP})"
    )]
    NotApiServer {
        /// The certificate's common name.
        common_name: String,
        /// The tenant whose CA signed it.
        tenant: String,
    },
    /// A client other than the one user the snapshot agent serves.
    #[error("only {user} may use the snapshot agent, not {common_name:?}")]
    NotUser {
        /// The user the agent serves.
        user: &'static str,
        /// The client certificate's common name.
        common_name: String,
    },
}

impl std::fmt::Debug for Serving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serving")
            .field("names", &self.names)
            .finish()
    }
}

impl Serving {
    /// A serving certificate for `names` (IP addresses and DNS names) signed by `ca`.
    pub fn new(ca: CertificateAuthority, names: Vec<String>) -> Result<Self, CertError> {
        Self::named("tenantplane-kubelet", ca, names)
    }

    /// A serving certificate with the common name `common_name`.
    pub fn named(
        common_name: &str,
        ca: CertificateAuthority,
        names: Vec<String>,
    ) -> Result<Self, CertError> {
        let provider = provider();
        let first = issue(common_name, &ca, &names, &provider)?;
        Ok(Self {
            common_name: common_name.to_string(),
            ca,
            names,
            provider,
            current: RwLock::new(first),
        })
    }

    /// Issue a fresh certificate; the old one keeps serving if that fails.
    pub fn renew(&self) -> Result<(), CertError> {
        let fresh = issue(&self.common_name, &self.ca, &self.names, &self.provider)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(())
    }

    /// The crypto provider the certificates were made with.
    pub fn provider(&self) -> Arc<CryptoProvider> {
        self.provider.clone()
    }
}

fn issue(
    common_name: &str,
    ca: &CertificateAuthority,
    names: &[String],
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, CertError> {
    let failed = |what: &'static str| {
        move |e: &dyn std::fmt::Display| CertError {
            common_name: common_name.to_string(),
            what,
            detail: e.to_string(),
        }
    };
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let pair = ca
        .issue(&Leaf::server(common_name, &refs).valid_for(SERVING_VALIDITY))
        .map_err(|e| failed("issuing the serving certificate")(&e))?;
    let chain = [pair.cert_pem.as_str(), ca.cert_pem()]
        .into_iter()
        .map(|pem| {
            tenantplane_pki::cert_der(pem)
                .map(CertificateDer::from)
                .map_err(|e| failed("reading the certificate chain")(&e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes())
        .map_err(|e| failed("reading the serving key")(&e))?;
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| failed("loading the serving key")(&e))?;
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

impl ResolvesServerCert for Serving {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }
}

/// The TenantCluster a client certificate belongs to.
#[derive(Clone, Debug, PartialEq)]
pub struct Identity {
    /// The host namespace of the tenant.
    pub namespace: String,
    /// The TenantCluster's controller owner reference (its name and UID).
    pub owner: OwnerReference,
}

/// The tenants' client CAs, read from their PKI Secrets (which the operator's cache of its own
/// Secrets holds), parsed once per Secret version.
pub struct Tenants {
    secrets: Store<Secret>,
    parsed: Mutex<HashMap<String, (String, Vec<u8>)>>,
}

impl std::fmt::Debug for Tenants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenants").finish_non_exhaustive()
    }
}

impl Tenants {
    /// No tenant parsed yet; each is read from `secrets` when first asked for.
    pub fn new(secrets: Store<Secret>) -> Self {
        Self {
            secrets,
            parsed: Mutex::new(HashMap::new()),
        }
    }

    /// The tenant whose client CA signed `cert` for its API server, valid at `now` (seconds).
    pub fn identify(&self, cert: &[u8], now: i64) -> Result<Identity, Refusal> {
        for secret in self.secrets.state() {
            let Some(owner) = secret
                .owner_references()
                .iter()
                .find(|o| o.kind == "TenantCluster" && o.controller == Some(true))
            else {
                continue;
            };
            if secret.name_any() != names::pki_secret(&owner.name) {
                continue;
            }
            let Some(ca) = self.client_ca(&secret) else {
                continue;
            };
            let Ok(info) = tenantplane_pki::verify_der_signed_by(cert, &ca) else {
                continue;
            };
            let namespace = secret.namespace().unwrap_or_default();
            let tenant = format!("{namespace}/{}", owner.name);
            if now < info.not_before || now > info.not_after {
                return Err(Refusal::NotValidNow {
                    owner: Some(tenant),
                });
            }
            if !info.organizations.iter().any(|o| o == API_SERVER_GROUP) {
                return Err(Refusal::NotApiServer {
                    common_name: info.common_name,
                    tenant,
                });
            }
            return Ok(Identity {
                namespace,
                owner: owner.clone(),
            });
        }
        Err(Refusal::UnknownSigner)
    }

    fn client_ca(&self, secret: &Secret) -> Option<Vec<u8>> {
        let uid = secret.uid()?;
        let version = secret.resource_version().unwrap_or_default();
        let mut parsed = self.parsed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((v, der)) = parsed.get(&uid)
            && *v == version
        {
            return Some(der.clone());
        }
        let pem = secret.data.as_ref()?.get(CLIENT_CA_CRT)?;
        let der = tenantplane_pki::cert_der(std::str::from_utf8(&pem.0).ok()?).ok()?;
        parsed.insert(uid, (version, der.clone()));
        Some(der)
    }
}

/// What a client certificate must be for a connection to go on: `Ok`, or why it is refused.
pub type CertCheck = dyn Fn(&[u8], i64) -> Result<(), Refusal> + Send + Sync;

/// Admits a client whose certificate passes a check (the kubelet endpoint's: a tenant API server
/// that [`Tenants::identify`] places; the snapshot agent's: the operator).
pub struct CheckedClients {
    /// The check every client certificate must pass.
    pub check: Box<CertCheck>,
    /// The crypto provider of the TLS configuration.
    pub provider: Arc<CryptoProvider>,
}

impl std::fmt::Debug for CheckedClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckedClients").finish_non_exhaustive()
    }
}

impl ClientCertVerifier for CheckedClients {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Every tenant's CA is acceptable; a Go client sends its certificate when none is hinted.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        (self.check)(end_entity.as_ref(), now.as_secs() as i64)
            .map(|()| ClientCertVerified::assertion())
            .map_err(|refusal| rustls::Error::General(refusal.to_string()))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant_pki::TenantPki;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    fn pki_secret(ns: &str, tenant: &str, uid: &str, pki: &TenantPki) -> Secret {
        let mut s: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": names::pki_secret(tenant), "namespace": ns, "uid": format!("s-{uid}"),
                         "resourceVersion": "1",
                         "ownerReferences": [{"apiVersion": "tenantplane.io/v1alpha1", "kind": "TenantCluster",
                                              "name": tenant, "uid": uid, "controller": true}]},
        }))
        .unwrap();
        s.data = Some(pki.to_secret_data());
        s
    }

    #[test]
    fn only_a_tenant_api_server_certificate_is_placed_and_by_its_own_ca() {
        let (a, b) = (
            TenantPki::generate("a").unwrap(),
            TenantPki::generate("b").unwrap(),
        );
        let (store, mut writer) = reflector::store::<Secret>();
        writer.apply_watcher_event(&Event::Apply(pki_secret("team-a", "a", "uid-a", &a)));
        writer.apply_watcher_event(&Event::Apply(pki_secret("team-b", "b", "uid-b", &b)));
        let tenants = Tenants::new(store);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let der = |pem: &str| tenantplane_pki::cert_der(pem).unwrap();

        let api_server = b
            .client_ca
            .issue(&Leaf::client("system:apiserver", &["system:masters"]))
            .unwrap();
        let who = tenants.identify(&der(&api_server.cert_pem), now).unwrap();
        assert_eq!(
            (who.namespace.as_str(), who.owner.uid.as_str()),
            ("team-b", "uid-b")
        );

        let user = a
            .client_ca
            .issue(&Leaf::client("alice", &["developers"]))
            .unwrap();
        let e = tenants.identify(&der(&user.cert_pem), now).unwrap_err();
        assert!(matches!(e, Refusal::NotApiServer { .. }), "{e}");
        let e = e.to_string();
        assert!(
            e.contains("team-a/a") && e.contains("system:masters"),
            "{e}"
        );

        let stranger = TenantPki::generate("c").unwrap();
        let foreign = stranger
            .client_ca
            .issue(&Leaf::client("system:apiserver", &["system:masters"]))
            .unwrap();
        let e = tenants.identify(&der(&foreign.cert_pem), now).unwrap_err();
        assert_eq!(e, Refusal::UnknownSigner);
        assert!(e.to_string().contains("not signed by any tenant"), "{e}");

        let e = tenants
            .identify(&der(&api_server.cert_pem), now + 400 * 24 * 3600)
            .unwrap_err();
        assert!(e.to_string().contains("not valid now"), "{e}");
    }

    #[test]
    fn the_serving_certificate_names_the_endpoint_and_renews() {
        let ca = CertificateAuthority::generate("kubelet-ca").unwrap();
        let serving = Serving::new(ca, vec!["10.96.0.42".into(), "kubelet.svc".into()]).unwrap();
        let first = serving.current.read().unwrap().clone();
        assert_eq!(first.cert.len(), 2, "leaf and CA");
        serving.renew().unwrap();
        let second = serving.current.read().unwrap().clone();
        assert_ne!(first.cert[0], second.cert[0]);
    }
}
