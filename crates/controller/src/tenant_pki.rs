//! A tenant's PKI: the CAs k3s expects under `<data-dir>/server/tls/` and its service-account
//! key, generated once by the operator and kept in Secret `<name>-pki`. It is never regenerated
//! while that Secret exists: every kubeconfig and token of the tenant trusts it.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use tenantplane_pki::{CertificateAuthority, KeyAndCert, Leaf};

/// File names as k3s reads them from `server/tls/`.
pub const SERVER_CA_CRT: &str = "server-ca.crt";
/// The server CA's key.
pub const SERVER_CA_KEY: &str = "server-ca.key";
/// The client CA, which signs every client certificate the API server accepts.
pub const CLIENT_CA_CRT: &str = "client-ca.crt";
/// The client CA's key.
pub const CLIENT_CA_KEY: &str = "client-ca.key";
/// The request-header CA, which signs the front proxy's client certificate.
pub const REQUEST_HEADER_CA_CRT: &str = "request-header-ca.crt";
/// The request-header CA's key.
pub const REQUEST_HEADER_CA_KEY: &str = "request-header-ca.key";
/// The key that signs service-account tokens.
pub const SERVICE_KEY: &str = "service.key";

/// The user the operator's kubeconfig authenticates as: a cluster admin of the tenant.
pub const ADMIN_USER: &str = "tenantplane-admin";
/// The group of the operator's kubeconfig user: cluster admins.
pub const ADMIN_GROUP: &str = "system:masters";
/// The operator's own user in the tenant (an admin too): its requests, and the syncer's, are
/// not a person's, so they do not keep a tenant awake.
pub const OPERATOR_USER: &str = "tenantplane:operator";

/// Why a tenant's PKI Secret cannot be used, or new CAs could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// A key of the Secret is missing: which.
    #[error("key {0} is missing")]
    Missing(&'static str),
    /// A key of the Secret holds no usable certificate or key.
    #[error("key {key} is not usable: {reason}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// New CAs or keys could not be made.
    #[error(transparent)]
    Generate(#[from] tenantplane_pki::Error),
}

/// The tenant's certificate authorities and service-account key.
#[derive(Debug)]
pub struct TenantPki {
    /// Signs the API server's serving certificate; clients trust it.
    pub server_ca: CertificateAuthority,
    /// Signs the client certificates the API server accepts.
    pub client_ca: CertificateAuthority,
    /// Signs the front proxy's client certificate for aggregated API servers.
    pub request_header_ca: CertificateAuthority,
    /// The service-account signing key, PEM.
    pub service_key: String,
}

impl TenantPki {
    /// New CAs for a tenant.
    pub fn generate(tenant: &str) -> Result<Self, PkiError> {
        Ok(Self {
            server_ca: CertificateAuthority::generate(&format!("{tenant}-server-ca"))?,
            client_ca: CertificateAuthority::generate(&format!("{tenant}-client-ca"))?,
            request_header_ca: CertificateAuthority::generate(&format!(
                "{tenant}-request-header-ca"
            ))?,
            service_key: tenantplane_pki::signing_key()?.private_pem,
        })
    }

    /// The Secret's data.
    pub fn to_secret_data(&self) -> BTreeMap<String, ByteString> {
        let entries = [
            (SERVER_CA_CRT, self.server_ca.cert_pem()),
            (SERVER_CA_KEY, self.server_ca.key_pem()),
            (CLIENT_CA_CRT, self.client_ca.cert_pem()),
            (CLIENT_CA_KEY, self.client_ca.key_pem()),
            (REQUEST_HEADER_CA_CRT, self.request_header_ca.cert_pem()),
            (REQUEST_HEADER_CA_KEY, self.request_header_ca.key_pem()),
            (SERVICE_KEY, self.service_key.as_str()),
        ];
        entries
            .into_iter()
            .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
            .collect()
    }

    /// Load the PKI from a Secret's data, saying exactly which key is missing or broken.
    pub fn from_secret_data(data: &BTreeMap<String, ByteString>) -> Result<Self, PkiError> {
        let text = |key: &'static str| -> Result<&str, PkiError> {
            let bytes = data.get(key).ok_or(PkiError::Missing(key))?;
            std::str::from_utf8(&bytes.0).map_err(|_| PkiError::Invalid {
                key,
                reason: "not UTF-8 PEM".into(),
            })
        };
        let ca = |crt: &'static str, key: &'static str| -> Result<CertificateAuthority, PkiError> {
            CertificateAuthority::from_pem(text(crt)?, text(key)?).map_err(|e| PkiError::Invalid {
                key: crt,
                reason: e.to_string(),
            })
        };
        let service_key = text(SERVICE_KEY)?;
        if !service_key.contains("PRIVATE KEY") {
            return Err(PkiError::Invalid {
                key: SERVICE_KEY,
                reason: "not a PEM private key".into(),
            });
        }
        Ok(Self {
            server_ca: ca(SERVER_CA_CRT, SERVER_CA_KEY)?,
            client_ca: ca(CLIENT_CA_CRT, CLIENT_CA_KEY)?,
            request_header_ca: ca(REQUEST_HEADER_CA_CRT, REQUEST_HEADER_CA_KEY)?,
            service_key: service_key.to_string(),
        })
    }

    /// A fresh admin client certificate for the operator's kubeconfig, valid for `validity`.
    pub fn issue_admin(&self, validity: Duration) -> Result<KeyAndCert, PkiError> {
        self.issue_admin_as(ADMIN_USER, validity)
    }

    /// An admin certificate for `user` ([`ADMIN_USER`] or [`OPERATOR_USER`]).
    pub fn issue_admin_as(&self, user: &str, validity: Duration) -> Result<KeyAndCert, PkiError> {
        Ok(self
            .client_ca
            .issue(&Leaf::client(user, &[ADMIN_GROUP]).valid_for(validity))?)
    }

    /// The CAs by the name the metrics give them, with when each expires.
    pub fn ca_expiry(&self) -> Vec<(&'static str, i64)> {
        [
            ("server-ca", &self.server_ca),
            ("client-ca", &self.client_ca),
            ("request-header-ca", &self.request_header_ca),
        ]
        .into_iter()
        .filter_map(|(name, ca)| {
            Some((
                name,
                tenantplane_pki::lifetime(ca.cert_pem()).ok()?.not_after,
            ))
        })
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pki_survives_its_secret_round_trip() {
        let pki = TenantPki::generate("dev").unwrap();
        let data = pki.to_secret_data();
        assert_eq!(data.len(), 7);
        let loaded = TenantPki::from_secret_data(&data).unwrap();
        assert_eq!(loaded.server_ca.cert_pem(), pki.server_ca.cert_pem());
        assert_eq!(loaded.client_ca.key_pem(), pki.client_ca.key_pem());
        let admin = loaded.issue_admin(Duration::from_secs(3600)).unwrap();
        let info =
            tenantplane_pki::verify_signed_by(&admin.cert_pem, pki.client_ca.cert_pem()).unwrap();
        assert_eq!(info.organizations, [ADMIN_GROUP]);
    }

    #[test]
    fn a_damaged_secret_names_the_broken_key() {
        let mut data = TenantPki::generate("dev").unwrap().to_secret_data();
        data.remove(CLIENT_CA_KEY);
        let err = TenantPki::from_secret_data(&data).unwrap_err();
        assert_eq!(err.to_string(), "key client-ca.key is missing");
        let mut data = TenantPki::generate("dev").unwrap().to_secret_data();
        data.insert(SERVER_CA_CRT.into(), ByteString(b"garbage".to_vec()));
        let err = TenantPki::from_secret_data(&data).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("key server-ca.crt is not usable"),
            "{err}"
        );
    }
}
