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

/// Why a certificate or key could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// rcgen could not make a key or a certificate.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// A stored key or certificate does not parse.
    #[error("{what} is not usable: {source}")]
    Parse {
        /// Which one, such as "the CA private key".
        what: &'static str,
        /// What rcgen said of it.
        source: rcgen::Error,
    },
    /// An alternative name that is neither a DNS name nor an IP address.
    #[error("{0:?} is neither a DNS name nor an IP address")]
    Name(String),
    /// A key could not be put into the form a file needs.
    #[error("encoding a key failed: {0}")]
    Encode(String),
    /// A certificate does not parse or does not check out; the text says which.
    #[error("{0}")]
    Invalid(String),
}

/// This crate's results, failing with [`Error`].
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
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM.
    pub key_pem: String,
}

/// What a leaf certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// A TLS server's certificate.
    Server,
    /// A client's certificate, for authenticating to a server.
    Client,
    /// Both: a server that is also a client of its peers.
    ServerAndClient,
}

/// A leaf certificate to issue.
#[derive(Clone, Debug)]
pub struct Leaf {
    /// The subject's common name; Kubernetes reads it as a client's user name.
    pub common_name: String,
    /// Kubernetes reads these as the client's groups.
    pub organizations: Vec<String>,
    /// DNS names and IP addresses, as text.
    pub alt_names: Vec<String>,
    /// Server, client or both.
    pub usage: Usage,
    /// How long the certificate is valid from now.
    pub validity: Duration,
}

impl Leaf {
    /// A server certificate for `alt_names`, valid for [`LEAF_VALIDITY`].
    pub fn server(common_name: impl Into<String>, alt_names: &[&str]) -> Self {
        Self {
            common_name: common_name.into(),
            organizations: Vec::new(),
            alt_names: alt_names.iter().map(|s| s.to_string()).collect(),
            usage: Usage::Server,
            validity: LEAF_VALIDITY,
        }
    }

    /// A client certificate for user `common_name` in groups `organizations`, valid for
    /// [`LEAF_VALIDITY`].
    pub fn client(common_name: impl Into<String>, organizations: &[&str]) -> Self {
        Self {
            common_name: common_name.into(),
            organizations: organizations.iter().map(|s| s.to_string()).collect(),
            alt_names: Vec::new(),
            usage: Usage::Client,
            validity: LEAF_VALIDITY,
        }
    }

    /// The same leaf, valid for `validity` instead.
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

    /// The CA's certificate, PEM: what clients trust.
    pub fn cert_pem(&self) -> &str {
        &self.pair.cert_pem
    }

    /// The CA's private key, PEM.
    pub fn key_pem(&self) -> &str {
        &self.pair.key_pem
    }

    /// The certificate and key, to keep in a Secret.
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
    /// The signing half, SEC1 PEM with the curve named.
    pub private_pem: String,
    /// The verifying half, SPKI PEM.
    pub public_pem: String,
}

/// The private half is SEC1 (`EC PRIVATE KEY`) with the curve named: Kubernetes reads public
/// keys out of that form but not out of PKCS#8, Go refuses SEC1 without the curve, and k3s hands
/// `service.key` to both the signing and the verifying flag.
pub fn signing_key() -> Result<SigningKey> {
    use base64::Engine;
    use p256::pkcs8::DecodePrivateKey;
    let key = KeyPair::generate()?;
    let secret = p256::SecretKey::from_pkcs8_der(&key.serialize_der())
        .map_err(|e| Error::Encode(e.to_string()))?;
    let der = secret
        .to_sec1_der()
        .map_err(|e| Error::Encode(e.to_string()))?;
    let der = with_named_curve(&der)?;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN EC PRIVATE KEY-----\n");
    for line in body.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END EC PRIVATE KEY-----\n");
    Ok(SigningKey {
        private_pem: pem,
        public_pem: key.public_key_pem(),
    })
}

/// Insert `[0] { prime256v1 }` after the private key octets of a SEC1 `ECPrivateKey` that lacks it.
fn with_named_curve(der: &[u8]) -> Result<Vec<u8>> {
    // SEQUENCE(len) INTEGER(1) OCTET STRING(32) [0]? [1]
    const PRIME256V1: [u8; 12] = [
        0xa0, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07,
    ];
    let bad = || Error::Encode("unexpected SEC1 layout".into());
    if der.len() < 39
        || der[0] != 0x30
        || der[1] as usize != der.len() - 2
        || der[5] != 0x04
        || der[6] != 32
    {
        return Err(bad());
    }
    if der.get(39) == Some(&0xa0) {
        return Ok(der.to_vec());
    }
    let len = der.len() - 2 + PRIME256V1.len();
    if len > 127 {
        return Err(bad());
    }
    let mut out = vec![0x30, len as u8];
    out.extend_from_slice(&der[2..39]);
    out.extend_from_slice(&PRIME256V1);
    out.extend_from_slice(&der[39..]);
    Ok(out)
}

/// Does the private key in `key_pem` belong to the certificate in `cert_pem`?
pub fn key_matches_certificate(key_pem: &str, cert_pem: &str) -> bool {
    let Ok(key) = KeyPair::from_pem(key_pem) else {
        return false;
    };
    let Ok(der) = parse_pem_cert(cert_pem) else {
        return false;
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(&der) else {
        return false;
    };
    use rcgen::PublicKeyData;
    cert.public_key().raw == key.subject_public_key_info().as_slice()
}

/// What a certificate says about itself, for checks before trusting a stored one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateInfo {
    /// The subject's common name.
    pub common_name: String,
    /// The subject's organizations (Kubernetes groups).
    pub organizations: Vec<String>,
    /// Seconds since the Unix epoch.
    pub not_before: i64,
    /// Seconds since the Unix epoch.
    pub not_after: i64,
}

fn parse_pem_cert(pem_text: &str) -> Result<Vec<u8>> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem_text.as_bytes())
        .map_err(|e| Error::Invalid(format!("not a PEM certificate: {e}")))?;
    Ok(pem.contents)
}

/// When a certificate was issued and when it expires (seconds since the Unix epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    /// `notBefore` plus the clock-skew allowance every certificate here is issued with.
    pub issued_at: i64,
    /// `notAfter`: when the certificate expires.
    pub not_after: i64,
}

/// The [`Lifetime`] of the certificate in `cert_pem`.
pub fn lifetime(cert_pem: &str) -> Result<Lifetime> {
    let der = parse_pem_cert(cert_pem)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| Error::Invalid(format!("certificate does not parse: {e}")))?;
    Ok(Lifetime {
        issued_at: cert.validity().not_before.timestamp() + CLOCK_SKEW.as_secs() as i64,
        not_after: cert.validity().not_after.timestamp(),
    })
}

/// The DNS names and IP addresses a certificate is valid for (its subject alternative names).
pub fn subject_alt_names(cert_pem: &str) -> Result<Vec<String>> {
    use x509_parser::extensions::GeneralName;
    let der = parse_pem_cert(cert_pem)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| Error::Invalid(format!("certificate does not parse: {e}")))?;
    let Ok(Some(sans)) = cert.subject_alternative_name() else {
        return Ok(Vec::new());
    };
    Ok(sans
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Some(dns.to_string()),
            GeneralName::IPAddress(bytes) => match bytes.len() {
                4 => Some(std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*bytes).ok()?).to_string()),
                16 => {
                    Some(std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*bytes).ok()?).to_string())
                }
                _ => None,
            },
            _ => None,
        })
        .collect())
}

/// Parse `cert_pem` and check that `ca_pem` signed it.
pub fn verify_signed_by(cert_pem: &str, ca_pem: &str) -> Result<CertificateInfo> {
    verify_der_signed_by(&parse_pem_cert(cert_pem)?, &parse_pem_cert(ca_pem)?)
}

/// The DER of the (first) certificate in `pem_text`.
pub fn cert_der(pem_text: &str) -> Result<Vec<u8>> {
    parse_pem_cert(pem_text)
}

/// [`verify_signed_by`] for DER certificates.
pub fn verify_der_signed_by(cert_der: &[u8], ca_der: &[u8]) -> Result<CertificateInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der)
        .map_err(|e| Error::Invalid(format!("certificate does not parse: {e}")))?;
    let (_, ca) = x509_parser::parse_x509_certificate(ca_der)
        .map_err(|e| Error::Invalid(format!("CA certificate does not parse: {e}")))?;
    // A certificate names its issuer: another CA's is refused without a signature check.
    if cert.issuer().as_raw() != ca.subject().as_raw() {
        return Err(Error::Invalid("certificate is not signed by the CA".into()));
    }
    cert.verify_signature(Some(ca.public_key()))
        .map_err(|_| Error::Invalid("certificate is not signed by the CA".into()))?;
    let subject = cert.subject();
    let common_name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string();
    let organizations = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Ok(CertificateInfo {
        common_name,
        organizations,
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
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
    fn verification_tells_signed_from_foreign_certificates() {
        let ca = CertificateAuthority::generate("ca").unwrap();
        let other = CertificateAuthority::generate("other").unwrap();
        let leaf = ca
            .issue(&Leaf::client("admin", &["system:masters"]))
            .unwrap();
        let info = verify_signed_by(&leaf.cert_pem, ca.cert_pem()).unwrap();
        assert_eq!(info.common_name, "admin");
        assert_eq!(info.organizations, ["system:masters"]);
        let err = verify_signed_by(&leaf.cert_pem, other.cert_pem()).unwrap_err();
        assert!(err.to_string().contains("not signed by the CA"), "{err}");
        assert!(verify_signed_by("junk", ca.cert_pem()).is_err());
        assert!(key_matches_certificate(&leaf.key_pem, &leaf.cert_pem));
        let other_leaf = ca.issue(&Leaf::client("x", &[])).unwrap();
        assert!(!key_matches_certificate(
            &other_leaf.key_pem,
            &leaf.cert_pem
        ));
    }

    #[test]
    fn signing_keys_are_sec1_with_a_public_half() {
        let key = signing_key().unwrap();
        assert!(
            key.private_pem
                .starts_with("-----BEGIN EC PRIVATE KEY-----")
        );
        assert!(key.public_pem.starts_with("-----BEGIN PUBLIC KEY-----"));
    }

    #[test]
    fn bad_alt_names_are_refused() {
        let ca = CertificateAuthority::generate("test-ca").unwrap();
        let err = ca.issue(&Leaf::server("x", &["not a name!"])).unwrap_err();
        assert!(err.to_string().contains("not a name!"), "{err}");
    }
}
