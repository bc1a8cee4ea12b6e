//! The host cluster's PKI: its CA, the API server's serving certificate, the service-account
//! signing key and the aggregation layer's CA, written where the components read them.

use std::path::{Path, PathBuf};

use tenantplane_pki::{CertificateAuthority, Leaf};

use crate::{Error, Result};

/// The files of a control plane's PKI, as the components read them.
pub(super) struct Pki {
    pub ca_crt: PathBuf,
    pub ca_key: PathBuf,
    pub serving_crt: PathBuf,
    pub serving_key: PathBuf,
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
    pub front_proxy_ca: PathBuf,
    pub front_proxy_crt: PathBuf,
    pub front_proxy_key: PathBuf,
}

/// The host control plane's certificates in `dir`; the API server's also names `node_ip`, the
/// address a real node's pods dial it on.
pub(super) fn write_pki(dir: &Path, node_ip: &str) -> Result<(Pki, CertificateAuthority)> {
    let ca = CertificateAuthority::generate("tenantplane-testenv-ca")?;
    let serving = ca.issue(&Leaf::server(
        "kube-apiserver",
        &[
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "10.96.0.1",
            node_ip,
        ],
    ))?;
    let pki = Pki {
        ca_crt: dir.join("ca.crt"),
        ca_key: dir.join("ca.key"),
        serving_crt: dir.join("apiserver.crt"),
        serving_key: dir.join("apiserver.key"),
        sa_key: dir.join("service-account.key"),
        sa_pub: dir.join("service-account.pub"),
        front_proxy_ca: dir.join("front-proxy-ca.crt"),
        front_proxy_crt: dir.join("front-proxy-client.crt"),
        front_proxy_key: dir.join("front-proxy-client.key"),
    };
    // The aggregation layer's CA: without it the controller manager and scheduler log a missing
    // request-header CA bundle forever.
    let front_proxy_ca = CertificateAuthority::generate("tenantplane-testenv-front-proxy-ca")?;
    let front_proxy = front_proxy_ca.issue(&Leaf::client("front-proxy-client", &[]))?;
    write(&pki.front_proxy_ca, front_proxy_ca.cert_pem())?;
    write(&pki.front_proxy_crt, &front_proxy.cert_pem)?;
    write(&pki.front_proxy_key, &front_proxy.key_pem)?;
    write(&pki.ca_crt, ca.cert_pem())?;
    write(&pki.ca_key, ca.key_pem())?;
    write(&pki.serving_crt, &serving.cert_pem)?;
    write(&pki.serving_key, &serving.key_pem)?;
    let sa = tenantplane_pki::signing_key()?;
    write(&pki.sa_key, &sa.private_pem)?;
    write(&pki.sa_pub, &sa.public_pem)?;
    Ok((pki, ca))
}

/// Write `contents` to `path`, saying which file failed.
pub(super) fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents)
        .map_err(|e| Error::Io(format!("writing {}: {e}", path.display())))
}
