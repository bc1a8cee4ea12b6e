//! The tenant's admin kubeconfig, kept in Secret `<name>-kubeconfig` under key `value` (the Cluster
//! API convention), and the check that a stored one is still sound.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use tenantplane_api::TenantCluster;
use tenantplane_pki::KeyAndCert;

use super::{identity, owned_metadata};
use crate::tenant_pki::{ADMIN_GROUP, TenantPki};
use crate::{Error, kubeconfig, names};

/// A kubeconfig for `server` with the tenant's server CA and a client certificate.
pub fn render(context: &str, server: &str, ca_pem: &str, client: &KeyAndCert) -> String {
    // Serializing a typed kubeconfig of strings cannot fail.
    kubeconfig::to_text(&kubeconfig::for_certificate(
        context, server, ca_pem, client,
    ))
    .unwrap_or_default()
}

/// The kubeconfig Secret for a freshly issued admin certificate.
pub fn kubeconfig_secret(
    tc: &TenantCluster,
    pki: &TenantPki,
    client: &KeyAndCert,
) -> Result<Secret, Error> {
    let (tenant, ns) = identity(tc)?;
    let mut secret = Secret {
        metadata: owned_metadata(tc, names::kubeconfig_secret(&tenant))?,
        type_: Some("cluster.x-k8s.io/secret".into()),
        ..Default::default()
    };
    let value = render(
        &tenant,
        &names::endpoint(&tenant, &ns),
        pki.server_ca.cert_pem(),
        client,
    );
    // Cluster API's label, so its tooling finds the kubeconfig of cluster `<tenant>`.
    secret
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("cluster.x-k8s.io/cluster-name".into(), tenant.clone());
    secret.data = Some(BTreeMap::from([(
        names::KUBECONFIG_KEY.to_string(),
        ByteString(value.into_bytes()),
    )]));
    Ok(secret)
}

/// The parts of a kubeconfig the operator relies on.
pub type ParsedKubeconfig = kubeconfig::Credentials;

/// Read back a kubeconfig written by [`render`].
pub fn parse(text: &str) -> Result<ParsedKubeconfig, String> {
    kubeconfig::credentials(text).map_err(|e| e.to_string())
}

/// The kubeconfig text stored in a Secret under key `value`.
pub fn stored_text(secret: &Secret) -> Option<&str> {
    let value = secret.data.as_ref()?.get(names::KUBECONFIG_KEY)?;
    std::str::from_utf8(&value.0).ok()
}

/// Why a stored kubeconfig Secret must be rewritten, or `None` when it is sound: the right
/// endpoint, the tenant's server CA, an admin certificate from the tenant's client CA whose key
/// matches and that does not expire within `renew_before` seconds of `now`.
pub fn needs_rewrite(
    secret: &Secret,
    tc: &TenantCluster,
    pki: &TenantPki,
    now: i64,
    renew_before: i64,
) -> Option<String> {
    let (tenant, ns) = identity(tc).ok()?;
    let Some(text) = stored_text(secret) else {
        return Some(format!(
            "key {} is missing or not text",
            names::KUBECONFIG_KEY
        ));
    };
    let parsed = match parse(text) {
        Ok(p) => p,
        Err(e) => return Some(format!("the kubeconfig does not parse: {e}")),
    };
    let endpoint = names::endpoint(&tenant, &ns);
    if parsed.server != endpoint {
        return Some(format!(
            "its server is {} instead of {endpoint}",
            parsed.server
        ));
    }
    if parsed.ca_pem.trim() != pki.server_ca.cert_pem().trim() {
        return Some("its certificate authority is not the tenant's server CA".into());
    }
    let info = match tenantplane_pki::verify_signed_by(
        &parsed.client.cert_pem,
        pki.client_ca.cert_pem(),
    ) {
        Ok(info) => info,
        Err(e) => return Some(format!("its client certificate is not usable: {e}")),
    };
    if !info.organizations.iter().any(|o| o == ADMIN_GROUP) {
        return Some("its client certificate is not an admin certificate".into());
    }
    if !tenantplane_pki::key_matches_certificate(&parsed.client.key_pem, &parsed.client.cert_pem) {
        return Some("its client key does not match its certificate".into());
    }
    if info.not_after - now < renew_before {
        let at = k8s_openapi::jiff::Timestamp::from_second(info.not_after)
            .map(|t| t.to_string())
            .unwrap_or_else(|_| info.not_after.to_string());
        return Some(format!(
            "its client certificate expires at {at}, within the renewal window of {}",
            crate::names::human_duration(renew_before)
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures::tenant;
    use std::time::Duration;

    const MONTH: i64 = 30 * 24 * 3600;
    const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

    fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    #[test]
    fn a_fresh_kubeconfig_is_sound_and_reads_back() {
        let tc = tenant();
        let pki = TenantPki::generate("dev").unwrap();
        let admin = pki.issue_admin(YEAR).unwrap();
        let secret = kubeconfig_secret(&tc, &pki, &admin).unwrap();
        assert_eq!(secret.metadata.name.as_deref(), Some("dev-kubeconfig"));
        assert_eq!(needs_rewrite(&secret, &tc, &pki, now(), MONTH), None);
        let text = String::from_utf8(secret.data.unwrap()["value"].0.clone()).unwrap();
        let parsed = parse(&text).unwrap();
        assert_eq!(parsed.server, "https://dev.team-dev.svc:6443");
        assert_eq!(parsed.client, admin);
    }

    #[test]
    fn tampered_kubeconfigs_are_caught() {
        let tc = tenant();
        let pki = TenantPki::generate("dev").unwrap();
        let other = TenantPki::generate("other").unwrap();
        let good = kubeconfig_secret(&tc, &pki, &pki.issue_admin(YEAR).unwrap()).unwrap();

        let foreign = kubeconfig_secret(&tc, &pki, &other.issue_admin(YEAR).unwrap()).unwrap();
        assert!(
            needs_rewrite(&foreign, &tc, &pki, now(), MONTH)
                .unwrap()
                .contains("not signed by the CA")
        );

        let mut garbage = good.clone();
        garbage.data = Some(BTreeMap::from([(
            "value".into(),
            ByteString(b"nope: [".to_vec()),
        )]));
        assert!(
            needs_rewrite(&garbage, &tc, &pki, now(), MONTH)
                .unwrap()
                .contains("does not parse")
        );

        let mut empty = good.clone();
        empty.data = None;
        assert_eq!(
            needs_rewrite(&empty, &tc, &pki, now(), MONTH).unwrap(),
            "key value is missing or not text"
        );

        let mut moved = tc.clone();
        moved.metadata.namespace = Some("elsewhere".into());
        assert!(
            needs_rewrite(&good, &moved, &pki, now(), MONTH)
                .unwrap()
                .contains("instead of")
        );

        let a_year_on = now() + 360 * 24 * 3600;
        assert!(
            needs_rewrite(&good, &tc, &pki, a_year_on, MONTH)
                .unwrap()
                .contains("expires")
        );
    }
}
