//! The tenant's admin kubeconfig, kept in Secret `<name>-kubeconfig` under key `value` (the Cluster
//! API convention), the operator's own beside it under key `operator`, and the check that a
//! stored one is still sound. The operator reaches the tenant as a user of its own
//! ([`OPERATOR_USER`]), so the tenant's audit tells its requests from a person's: only those
//! keep a tenant awake (see [`super::audit`]).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use tenantplane_api::TenantCluster;
use tenantplane_pki::KeyAndCert;

use super::{identity, owned_metadata};
use crate::tenant_pki::{ADMIN_GROUP, ADMIN_USER, OPERATOR_USER, TenantPki};
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
    operator: &KeyAndCert,
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
    let operator = render(
        &tenant,
        &names::endpoint(&tenant, &ns),
        pki.server_ca.cert_pem(),
        operator,
    );
    secret.data = Some(BTreeMap::from([
        (
            names::KUBECONFIG_KEY.to_string(),
            ByteString(value.into_bytes()),
        ),
        (
            names::OPERATOR_KUBECONFIG_KEY.to_string(),
            ByteString(operator.into_bytes()),
        ),
    ]));
    Ok(secret)
}

/// The parts of a kubeconfig the operator relies on.
pub type ParsedKubeconfig = kubeconfig::Credentials;

/// Read back a kubeconfig written by [`render`].
pub fn parse(text: &str) -> Result<ParsedKubeconfig, kubeconfig::KubeconfigError> {
    kubeconfig::credentials(text)
}

/// The kubeconfig text stored in a Secret under key `value`.
pub fn stored_text(secret: &Secret) -> Option<&str> {
    stored_key(secret, names::KUBECONFIG_KEY)
}

/// The operator's kubeconfig text, under key `operator`.
pub fn operator_text(secret: &Secret) -> Option<&str> {
    stored_key(secret, names::OPERATOR_KUBECONFIG_KEY)
}

/// The kubeconfig Secret does not hold the operator's kubeconfig yet.
#[derive(Debug, thiserror::Error)]
#[error(
    "the kubeconfig Secret has no {} key yet",
    names::OPERATOR_KUBECONFIG_KEY
)]
pub struct NoOperatorKubeconfig;

/// The operator's own kubeconfig of a tenant, from its kubeconfig Secret, or why not.
pub fn require_operator_text(secret: &Secret) -> Result<String, NoOperatorKubeconfig> {
    operator_text(secret)
        .map(str::to_string)
        .ok_or(NoOperatorKubeconfig)
}

fn stored_key<'a>(secret: &'a Secret, key: &str) -> Option<&'a str> {
    let value = secret.data.as_ref()?.get(key)?;
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
    let endpoint = names::endpoint(&tenant, &ns);
    [
        (names::KUBECONFIG_KEY, ADMIN_USER),
        (names::OPERATOR_KUBECONFIG_KEY, OPERATOR_USER),
    ]
    .into_iter()
    .find_map(|(key, user)| {
        let text = stored_key(secret, key);
        unsound(text, key, user, &endpoint, pki, now, renew_before)
    })
}

/// Why the kubeconfig under `key` (for `user`) is not sound, or `None`.
fn unsound(
    text: Option<&str>,
    key: &str,
    user: &str,
    endpoint: &str,
    pki: &TenantPki,
    now: i64,
    renew_before: i64,
) -> Option<String> {
    let Some(text) = text else {
        return Some(format!("key {key} is missing or not text"));
    };
    let parsed = match parse(text) {
        Ok(p) => p,
        Err(e) => return Some(format!("the kubeconfig under {key} does not parse: {e}")),
    };
    if parsed.server != endpoint {
        return Some(format!(
            "the server under {key} is {} instead of {endpoint}",
            parsed.server
        ));
    }
    if parsed.ca_pem.trim() != pki.server_ca.cert_pem().trim() {
        return Some(format!(
            "the certificate authority under {key} is not the tenant's server CA"
        ));
    }
    let info = match tenantplane_pki::verify_signed_by(
        &parsed.client.cert_pem,
        pki.client_ca.cert_pem(),
    ) {
        Ok(info) => info,
        Err(e) => {
            return Some(format!(
                "the client certificate under {key} is not usable: {e}"
            ));
        }
    };
    if !info.organizations.iter().any(|o| o == ADMIN_GROUP) || info.common_name != user {
        return Some(format!(
            "the client certificate under {key} is not {user}'s admin certificate"
        ));
    }
    if !tenantplane_pki::key_matches_certificate(&parsed.client.key_pem, &parsed.client.cert_pem) {
        return Some(format!(
            "the client key under {key} does not match its certificate"
        ));
    }
    if info.not_after - now < renew_before {
        let at = k8s_openapi::jiff::Timestamp::from_second(info.not_after)
            .map(|t| t.to_string())
            .unwrap_or_else(|_| info.not_after.to_string());
        return Some(format!(
            "the client certificate under {key} expires at {at}, within the renewal window of {}",
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

    fn operator(pki: &TenantPki) -> KeyAndCert {
        pki.issue_admin_as(OPERATOR_USER, YEAR).unwrap()
    }

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
        let ours = operator(&pki);
        let secret = kubeconfig_secret(&tc, &pki, &admin, &ours).unwrap();
        assert_eq!(secret.metadata.name.as_deref(), Some("dev-kubeconfig"));
        assert_eq!(needs_rewrite(&secret, &tc, &pki, now(), MONTH), None);
        let text = stored_text(&secret).unwrap();
        let parsed = parse(text).unwrap();
        assert_eq!(parsed.server, "https://dev.team-dev.svc:6443");
        assert_eq!(parsed.client, admin);
        let parsed = parse(operator_text(&secret).unwrap()).unwrap();
        assert_eq!(parsed.client, ours, "the operator's own user beside it");
    }

    #[test]
    fn the_operator_kubeconfig_must_be_there_and_be_the_operator() {
        let tc = tenant();
        let pki = TenantPki::generate("dev").unwrap();
        let admin = pki.issue_admin(YEAR).unwrap();
        let mut missing = kubeconfig_secret(&tc, &pki, &admin, &operator(&pki)).unwrap();
        missing
            .data
            .as_mut()
            .unwrap()
            .remove(names::OPERATOR_KUBECONFIG_KEY);
        assert_eq!(
            needs_rewrite(&missing, &tc, &pki, now(), MONTH).unwrap(),
            "key operator is missing or not text",
            "a Secret from before the operator's own user is rewritten"
        );
        let swapped = kubeconfig_secret(&tc, &pki, &admin, &admin).unwrap();
        assert!(
            needs_rewrite(&swapped, &tc, &pki, now(), MONTH)
                .unwrap()
                .contains("is not tenantplane:operator's admin certificate")
        );
    }

    #[test]
    fn tampered_kubeconfigs_are_caught() {
        let tc = tenant();
        let pki = TenantPki::generate("dev").unwrap();
        let other = TenantPki::generate("other").unwrap();
        let good =
            kubeconfig_secret(&tc, &pki, &pki.issue_admin(YEAR).unwrap(), &operator(&pki)).unwrap();

        let foreign = kubeconfig_secret(
            &tc,
            &pki,
            &other.issue_admin(YEAR).unwrap(),
            &operator(&pki),
        )
        .unwrap();
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
