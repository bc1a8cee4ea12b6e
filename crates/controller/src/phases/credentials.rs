//! A tenant's credentials, as the reconcile keeps them: its PKI Secret (made once, never
//! replaced), the admin kubeconfig Secret (rewritten when wrong or due, or when the
//! `rotate-certificates` annotation asks), and the expiry metrics of both.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use tenantplane_api::TenantCluster;
use tracing::info;

use super::report::publish;
use super::{Phase, stop};
use crate::Error;
use crate::build;
use crate::cache;
use crate::context::Context;
use crate::names::{self, FIELD_MANAGER};
use crate::status::Progress;
use crate::tenant_pki::TenantPki;

/// The tenant's PKI (created once, never regenerated); a damaged one stops the reconcile.
pub(crate) async fn pki(tc: &TenantCluster, ctx: &Context) -> Phase<TenantPki> {
    let (_, ns) = build::identity(tc)?;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    match ensure_pki(ctx, tc, &secrets).await? {
        Ok(pki) => Ok(pki),
        Err(damaged) => stop(Progress::PkiDamaged(damaged.to_string())),
    }
}

/// The admin kubeconfig the tenant is reached with, and how soon to look again so that its
/// certificate is renewed in time.
pub(crate) struct Kubeconfig {
    pub text: String,
    pub renew_in: Duration,
}

/// The admin kubeconfig: renewed before its certificate expires, or now when the annotation asks
/// (which is then removed).
pub(crate) async fn kubeconfig(
    tc: &TenantCluster,
    ctx: &Context,
    pki: &TenantPki,
) -> Result<Kubeconfig, Error> {
    let (_, ns) = build::identity(tc)?;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let rotate = tc.annotations().contains_key(names::ROTATE_CERTIFICATES);
    let (text, renew_at) = ensure_kubeconfig(ctx, tc, &secrets, pki, rotate).await?;
    // Look again when the certificate is due, even if nothing else happens by then.
    let renew_in = Duration::from_secs((renew_at - Timestamp::now().as_second()).max(1) as u64);
    if rotate {
        forget_rotation_request(ctx, tc).await?;
    }
    Ok(Kubeconfig { text, renew_in })
}

/// A rotation request finds a certificate issued less than this long ago already rotated.
const ROTATION_DEBOUNCE_SECS: i64 = 15;

/// The tenant's PKI Secret is there but does not hold a sound PKI: it is never replaced
/// silently (a new CA would lock out every client of the old one).
#[derive(Debug, thiserror::Error)]
#[error("Secret {secret}: {source}")]
struct PkiDamaged {
    secret: String,
    #[source]
    source: crate::tenant_pki::PkiError,
}

/// Load the tenant's PKI, creating it on first sight. `Ok(Err(..))`: the Secret is damaged and
/// must not be replaced silently.
async fn ensure_pki(
    ctx: &Context,
    tc: &TenantCluster,
    secrets: &Api<Secret>,
) -> Result<Result<TenantPki, PkiDamaged>, Error> {
    let (tenant, _) = build::identity(tc)?;
    let name = names::pki_secret(&tenant);
    let (_, ns) = build::identity(tc)?;
    if let Some(secret) = cache::get(&ctx.caches.secrets, Some(&ns), &name) {
        return Ok(
            TenantPki::from_secret_data(&secret.data.clone().unwrap_or_default()).map_err(
                |source| PkiDamaged {
                    secret: name.clone(),
                    source,
                },
            ),
        );
    }
    let pki = TenantPki::generate(&tenant)?;
    match secrets
        .create(
            &PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            },
            &build::control_plane::pki_secret(tc, &pki)?,
        )
        .await
    {
        Ok(_) => {
            publish(
                ctx,
                tc,
                EventType::Normal,
                "PKICreated",
                format!("generated the tenant's certificate authorities in Secret {name}"),
            )
            .await;
            Ok(Ok(pki))
        }
        // Another reconcile (or operator replica) won the race: use its PKI, never ours.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let secret = secrets.get(&name).await?;
            Ok(
                TenantPki::from_secret_data(&secret.data.unwrap_or_default()).map_err(|source| {
                    PkiDamaged {
                        secret: name.clone(),
                        source,
                    }
                }),
            )
        }
        Err(e) => Err(e.into()),
    }
}

/// Make sure `<name>-kubeconfig` holds sound admin and operator kubeconfigs whose certificates
/// are not due for renewal (or new ones when `rotate`); returns the operator's text, which the
/// operator and syncer reach the tenant with, and when the certificates are due for renewal
/// (Unix seconds). The CAs are never touched here.
async fn ensure_kubeconfig(
    ctx: &Context,
    tc: &TenantCluster,
    secrets: &Api<Secret>,
    pki: &TenantPki,
    rotate: bool,
) -> Result<(String, i64), Error> {
    let (tenant, ns) = build::identity(tc)?;
    let name = names::kubeconfig_secret(&tenant);
    let certificates = ctx.options.certificates;
    let existing = cache::get(&ctx.caches.secrets, Some(&ns), &name);
    let now_secs = Timestamp::now().as_second();
    let renew_before = certificates.renew_before.as_secs() as i64;
    // A rotation asked for is done once: a reconcile that still sees the annotation (its cache
    // behind our removal of it) finds a certificate issued moments ago and keeps it.
    let issued_just_now = |secret: &Secret| {
        build::kubeconfig::stored_text(secret)
            .and_then(|t| build::kubeconfig::parse(t).ok())
            .and_then(|k| tenantplane_pki::lifetime(&k.client.cert_pem).ok())
            .is_some_and(|l| now_secs - l.issued_at < ROTATION_DEBOUNCE_SECS)
    };
    let why = match existing.as_deref() {
        None => None,
        Some(secret) if rotate && !issued_just_now(secret) => Some(format!(
            "rotation requested by annotation {}",
            names::ROTATE_CERTIFICATES
        )),
        Some(secret) => {
            match build::kubeconfig::needs_rewrite(secret, tc, pki, now_secs, renew_before) {
                None => {
                    let text = build::kubeconfig::stored_text(secret).unwrap_or_default();
                    let expires = record_expiry(ctx, &ns, &tenant, pki, text);
                    let operator = build::kubeconfig::operator_text(secret).unwrap_or_default();
                    return Ok((operator.into(), expires.unwrap_or(now_secs) - renew_before));
                }
                Some(why) => Some(why),
            }
        }
    };
    let admin = pki.issue_admin(certificates.validity)?;
    let operator = pki.issue_admin_as(crate::tenant_pki::OPERATOR_USER, certificates.validity)?;
    let secret = build::kubeconfig::kubeconfig_secret(tc, pki, &admin, &operator)?;
    secrets
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await?;
    let (reason, note) = match why {
        None => (
            "KubeconfigWritten",
            format!("wrote the admin kubeconfig to Secret {name}"),
        ),
        Some(why) => (
            "KubeconfigRewritten",
            format!("rewrote Secret {name} with a new admin certificate: {why}"),
        ),
    };
    info!(secret = %name, reason, "{note}");
    publish(ctx, tc, EventType::Normal, reason, note).await;
    let text = build::kubeconfig::stored_text(&secret).unwrap_or_default();
    let expires = record_expiry(ctx, &ns, &tenant, pki, text);
    let operator = build::kubeconfig::operator_text(&secret).unwrap_or_default();
    Ok((operator.into(), expires.unwrap_or(now_secs) - renew_before))
}

/// The `kubernetes` distribution's component certificates, in `<name>-control-plane-certs`:
/// issued when missing, unsound, issued for other names (a new API Service address) or due, and
/// when the `rotate-certificates` annotation asks (the kubeconfig's phase removes it). The pod
/// reads the files again; it is not restarted. Returns how soon to look again.
pub(crate) async fn component_certificates(
    tc: &TenantCluster,
    ctx: &Context,
    pki: &TenantPki,
    addressing: &build::layout::Addressing,
) -> Result<Duration, Error> {
    let (tenant, ns) = build::identity(tc)?;
    let name = names::control_plane_certs(&tenant);
    let options = &ctx.options.build;
    let certificates = ctx.options.certificates;
    let now = Timestamp::now().as_second();
    let renew_before = certificates.renew_before.as_secs() as i64;
    let existing = cache::get(&ctx.caches.secrets, Some(&ns), &name);
    let rotate = tc.annotations().contains_key(names::ROTATE_CERTIFICATES);
    let issued_just_now = |secret: &Secret| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(build::kubernetes::SERVING_CRT))
            .and_then(|pem| std::str::from_utf8(&pem.0).ok())
            .and_then(|pem| tenantplane_pki::lifetime(pem).ok())
            .is_some_and(|l| now - l.issued_at < ROTATION_DEBOUNCE_SECS)
    };
    let why = match existing.as_deref() {
        None => None,
        Some(secret) if rotate && !issued_just_now(secret) => Some(format!(
            "rotation requested by annotation {}",
            names::ROTATE_CERTIFICATES
        )),
        Some(secret) => match build::kubernetes::certificates_due(
            secret,
            tc,
            pki,
            addressing,
            options,
            now,
            renew_before,
        ) {
            Ok(due_at) => return Ok(Duration::from_secs((due_at - now).max(1) as u64)),
            Err(why) => Some(why.to_string()),
        },
    };
    let secret = build::kubernetes::certificates_secret(
        tc,
        pki,
        addressing,
        options,
        certificates.validity,
    )?;
    Api::<Secret>::namespaced(ctx.client.clone(), &ns)
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await
        .map_err(|error| Error::Write {
            object: format!("applying Secret {ns}/{name}"),
            error,
        })?;
    let (reason, note) = match why {
        None => (
            "CertificatesIssued",
            format!("issued the control plane's component certificates into Secret {name}"),
        ),
        Some(why) => (
            "CertificatesReissued",
            format!(
                "issued the control plane's component certificates again into Secret {name}: {why}"
            ),
        ),
    };
    info!(secret = %name, reason, "{note}");
    publish(ctx, tc, EventType::Normal, reason, note).await;
    let validity = certificates.validity.as_secs() as i64;
    Ok(Duration::from_secs((validity - renew_before).max(1) as u64))
}

/// Export when the tenant's admin certificate and CAs expire; returns when the admin
/// certificate does.
fn record_expiry(
    ctx: &Context,
    ns: &str,
    tenant: &str,
    pki: &TenantPki,
    kubeconfig: &str,
) -> Option<i64> {
    let metrics = &ctx.options.telemetry.metrics;
    for (ca, at) in pki.ca_expiry() {
        metrics.certificate_expires(ns, tenant, ca, at);
    }
    let at = build::kubeconfig::parse(kubeconfig)
        .ok()
        .and_then(|k| tenantplane_pki::lifetime(&k.client.cert_pem).ok())?
        .not_after;
    metrics.certificate_expires(ns, tenant, "admin", at);
    Some(at)
}

/// The rotation the annotation asked for is done: remove it (a JSON merge patch with null), so
/// the next reconcile does not rotate again.
async fn forget_rotation_request(ctx: &Context, tc: &TenantCluster) -> Result<(), Error> {
    super::report::remove_annotation(ctx, tc, names::ROTATE_CERTIFICATES).await?;
    publish(
        ctx,
        tc,
        EventType::Normal,
        "CertificatesRotated",
        format!(
            "issued a new admin certificate as annotation {} asked, and removed the annotation; the CAs are unchanged",
            names::ROTATE_CERTIFICATES
        ),
    )
    .await;
    Ok(())
}
