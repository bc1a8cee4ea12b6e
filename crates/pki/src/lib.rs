//! Certificate authorities and the leaf certificates they sign. TenantPlane creates the PKI of
//! every control plane itself (as Kamaji does) so it never needs to exec into a pod; the test
//! control plane uses the same code. Keys are ECDSA P-256.

use std::net::IpAddr;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::OffsetDateTime;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{what} is not usable: {source}")]
    Parse {
        what: &'static str,
        source: rcgen::Error,
    },
    #[error("{0:?} is neither a DNS name nor an IP address")]
    Name(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Certificates are valid from a little before now, so a peer whose clock runs behind accepts them.
const CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);

/// Ten years: a CA outlives the leaves it signs, which rotate.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// One year for leaf certificates unless the caller says otherwise.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// A certificate and its private key, both PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyAndCert {
    pub cert_pem: String,
    pub key_pem: String,
}

/// What a leaf certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    Server,
    Client,
    ServerAndClient,
}

/// A leaf certificate to issue.
#[derive(Clone, Debug)]
pub struct Leaf {
    pub common_name: String,
    /// Kubernetes reads these as the client's groups.
    pub organizations: Vec<String>,
    /// DNS names and IP addresses, as text.
    pub alt_names: Vec<String>,
    pub usage: Usage,
    pub validity: Duration,
}

impl Leaf {
    pub fn server(common_name: impl Into<String>, alt_names: &[&str]) -> Self {
        Self {
            common_name: common_name.into(),
            organizations: Vec::new(),
            alt_names: alt_names.iter().map(|s| s.to_string()).collect(),
            usage: Usage::Server,
            validity: LEAF_VALIDITY,
        }
    }

    pub fn client(common_name: impl Into<String>, organizations: &[&str]) -> Self {
        Self {
            common_name: common_name.into(),
            organizations: organizations.iter().map(|s| s.to_string()).collect(),
            alt_names: Vec::new(),
            usage: Usage::Client,
            validity: LEAF_VALIDITY,
        }
    }

    pub fn valid_for(mut self, validity: Duration) -> Self {
        self.validity = validity;
        self
    }
}

/// A certificate authority whose key is held in memory, PEM in and out.
pub struct CertificateAuthority {
    pair: KeyAndCert,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .finish_non_exhaustive()
    }
}

fn validity(params: &mut CertificateParams, validity: Duration) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - CLOCK_SKEW;
    params.not_after = now + validity;
}

fn subject(common_name: &str, organizations: &[String]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    for org in organizations {
        dn.push(DnType::OrganizationName, org.as_str());
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

impl CertificateAuthority {
    /// A new self-signed CA.
    pub fn generate(common_name: &str) -> Result<Self> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = subject(common_name, &[]);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, CA_VALIDITY);
        let cert = params.self_signed(&key)?;
        let pair = KeyAndCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        };
        Self::from_pem(&pair.cert_pem, &pair.key_pem)
    }

    /// Load an existing CA, as kept in a Secret. Never regenerate a CA that exists: every client
    /// and kubeconfig trusts it.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self> {
        let key = KeyPair::from_pem(key_pem).map_err(|source| Error::Parse {
            what: "the CA private key",
            source,
        })?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).map_err(|source| Error::Parse {
            what: "the CA certificate",
            source,
        })?;
        Ok(Self {
            pair: KeyAndCert {
                cert_pem: cert_pem.to_string(),
                key_pem: key_pem.to_string(),
            },
            issuer,
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.pair.cert_pem
    }

    pub fn key_pem(&self) -> &str {
        &self.pair.key_pem
    }

    pub fn to_pair(&self) -> KeyAndCert {
        self.pair.clone()
    }

    /// Issue a leaf certificate with a fresh key.
    pub fn issue(&self, leaf: &Leaf) -> Result<KeyAndCert> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = subject(&leaf.common_name, &leaf.organizations);
        params.subject_alt_names = leaf
            .alt_names
            .iter()
            .map(|name| alt_name(name))
            .collect::<Result<_>>()?;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = match leaf.usage {
            Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Usage::ServerAndClient => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        };
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, leaf.validity);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(KeyAndCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn alt_name(name: &str) -> Result<SanType> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    if !is_dns_name(name) {
        return Err(Error::Name(name.to_string()));
    }
    name.to_string()
        .try_into()
        .map(SanType::DnsName)
        .map_err(|_| Error::Name(name.to_string()))
}

/// A DNS name as certificates carry it: dot-separated labels of letters, digits and `-`.
fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// A key pair for signing service-account tokens: the API server signs with the private half
/// (PKCS#8 PEM) and verifies with the public half (SPKI PEM), each in a file of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SigningKey {
    pub private_pem: String,
    pub public_pem: String,
}

pub fn signing_key() -> Result<SigningKey> {
    let key = KeyPair::generate()?;
    Ok(SigningKey {
        private_pem: key.serialize_pem(),
        public_pem: key.public_key_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_reloaded_from_pem_signs_leaves() {
        let ca = CertificateAuthority::generate("test-ca").unwrap();
        let reloaded = CertificateAuthority::from_pem(ca.cert_pem(), ca.key_pem()).unwrap();
        assert_eq!(reloaded.cert_pem(), ca.cert_pem());
        let leaf = reloaded
            .issue(&Leaf::server("apiserver", &["localhost", "127.0.0.1"]))
            .unwrap();
        assert!(leaf.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(leaf.key_pem.contains("PRIVATE KEY"));
    }

    #[test]
    fn garbage_is_refused_with_what_was_wrong() {
        let ca = CertificateAuthority::generate("test-ca").unwrap();
        let err = CertificateAuthority::from_pem("not a cert", ca.key_pem()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("the CA certificate is not usable"),
            "{err}"
        );
        let err = CertificateAuthority::from_pem(ca.cert_pem(), "not a key").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("the CA private key is not usable"),
            "{err}"
        );
    }

    #[test]
    fn bad_alt_names_are_refused() {
        let ca = CertificateAuthority::generate("test-ca").unwrap();
        let err = ca.issue(&Leaf::server("x", &["not a name!"])).unwrap_err();
        assert!(err.to_string().contains("not a name!"), "{err}");
    }
}
