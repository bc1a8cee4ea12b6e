//! The last phase: reach the tenant API server, then keep its syncer running; the syncer's
//! verdict is the Synced condition.

use std::time::Duration;

use tenantplane_api::TenantCluster;
use tenantplane_syncer::SyncerSpec;

use super::credentials::Kubeconfig;
use super::provision::{ControlPlane, for_too_long, waiting, was_up};
use super::resolve::Policies;
use super::{Phase, stop};
use crate::build;
use crate::context::Context;
use crate::status::Progress;

/// How long the tenant API server has to answer the reconcile's one question.
const TENANT_ANSWER_WITHIN: Duration = Duration::from_secs(15);

const ROLLING_OUT: &str = "the control plane is rolling out a change";

/// While a change rolls out, a control plane that does not answer is on its way, not broken.
pub(crate) async fn tenant(
    tc: &TenantCluster,
    ctx: &Context,
    policies: &Policies,
    control_plane: ControlPlane,
    kubeconfig: &Kubeconfig,
) -> Phase<Progress> {
    let (tenant, ns) = build::identity(tc)?;
    let ControlPlane {
        pod,
        addressing,
        rolling: replacing,
        ..
    } = control_plane;
    let connector = &ctx.options.connector;
    let kubeconfig = &kubeconfig.text;
    let server = match connector.server(&tenant, &ns, &pod) {
        Ok(s) => s,
        Err(e) => return stop(unreachable(tc, replacing, e.to_string())),
    };
    let tenant_client = match connector.client(kubeconfig, &tenant, &ns, &server).await {
        Ok(c) => c,
        Err(e) => return stop(unreachable(tc, replacing, e.to_string())),
    };
    tracing::debug!(%server, "asking the tenant for its version");
    // Bounded as a whole: a wedged server can take the connection and never finish TLS, which
    // the client's own timeouts (connect, read) do not cover.
    let asked = tokio::time::timeout(TENANT_ANSWER_WITHIN, tenant_client.apiserver_version());
    let version = match asked.await {
        Ok(Ok(info)) => info.git_version,
        Ok(Err(e)) => {
            let detail = format!("{server}: {e}");
            return stop(unreachable(tc, replacing, detail));
        }
        Err(_) => {
            let detail = format!(
                "{server}: no answer to GET /version within {}s",
                TENANT_ANSWER_WITHIN.as_secs()
            );
            return stop(unreachable(tc, replacing, detail));
        }
    };
    tracing::debug!(%version, "the tenant answered");
    if tc.spec.sleep.after_idle().is_some() {
        read_activity(tc, ctx, &tenant_client).await;
    }
    // Sync: the tenant's syncer runs continuously; its verdict is the Synced condition.
    let watch_client = match connector
        .watch_client(kubeconfig, &tenant, &ns, &server)
        .await
    {
        Ok(c) => c,
        Err(e) => return stop(unreachable(tc, replacing, e.to_string())),
    };
    let spec = SyncerSpec {
        tenant: tenant.clone(),
        host_namespace: ns.clone(),
        owner: build::owner_reference(tc)?,
        scope: ctx.options.namespace.clone(),
        policy: policies.sync_policy.spec.clone(),
        profile: policies.profile.spec.clone(),
        server,
        kubeconfig: kubeconfig.clone(),
        api_ip: addressing.api_ip,
        service_cidr: addressing.service_cidr,
        kubelet: ctx
            .options
            .build
            .kubelet
            .as_ref()
            .map(|k| k.endpoint.clone()),
    };
    Ok(match ctx.syncers.ensure(spec, watch_client).await {
        Ok(summary) => Progress::Synced { version, summary },
        Err(failure) if replacing => {
            waiting(format!("{ROLLING_OUT}; syncing: {}", failure.message))
        }
        Err(failure) => Progress::SyncFailed {
            version,
            reason: failure.reason.to_string(),
            error: failure.message,
        },
    })
}

/// The tenant API server does not answer: Degraded when the tenant had been up. While a change
/// rolls out, or while its pod has just turned Ready after a start or an upgrade and the server
/// does not answer yet (a loaded machine makes that gap seconds long), it is on its way: it reads
/// Provisioning, and Degraded only once that has lasted too long.
fn unreachable(tc: &TenantCluster, replacing: bool, detail: String) -> Progress {
    if replacing {
        waiting(format!("{ROLLING_OUT}; the tenant API server: {detail}"))
    } else if !was_up(tc) {
        Progress::ControlPlaneNotReady {
            detail: format!("the tenant API server does not answer yet: {detail}"),
            stuck: for_too_long(tc),
        }
    } else {
        Progress::Unreachable(detail)
    }
}

/// Read how many requests the tenant audited (its use, see [`crate::sleep`]) into the activity
/// record. When it cannot be read, the tenant counts as used now: it never sleeps on a guess.
async fn read_activity(tc: &TenantCluster, ctx: &Context, tenant: &kube::Client) {
    let key = crate::context::tenant_key(tc);
    let now = k8s_openapi::jiff::Timestamp::now();
    let request = http::Request::get("/metrics").body(Vec::new());
    let asked = async {
        let request = request.map_err(|e| e.to_string())?;
        tenant
            .request_text(request)
            .await
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(TENANT_ANSWER_WITHIN, asked).await {
        Ok(Ok(text)) => ctx.state::<crate::sleep::Activity>().observe(
            &key,
            crate::sleep::audit_events(&text),
            now,
        ),
        failed => {
            let why = match failed {
                Ok(Err(e)) => e,
                _ => format!("no answer within {}s", TENANT_ANSWER_WITHIN.as_secs()),
            };
            ctx.state::<crate::sleep::Activity>().forget(&key);
            ctx.state::<crate::sleep::Activity>().observe(&key, 0, now);
            super::report::publish(
                ctx,
                tc,
                kube::runtime::events::EventType::Warning,
                "ActivityUnknown",
                format!(
                    "could not read the tenant's request count from its /metrics ({why}); it counts as used now, so spec.sleep.afterIdle starts again"
                ),
            )
            .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::phases::provision::tests::tenant_since as tenant;

    #[test]
    fn a_server_that_does_not_answer_is_degraded_only_once_it_had_been_up() {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let long_ago = "2026-01-01T00:00:00Z";
        let up = tenant("Ready", "True", "ControlPlaneReady", &now);
        assert!(matches!(
            unreachable(&up, false, "refused".into()),
            Progress::Unreachable(_)
        ));
        // Rolling out: on its way, whatever it was.
        let rolling = unreachable(&up, true, "refused".into());
        assert!(matches!(
            rolling,
            Progress::ControlPlaneNotReady { stuck: false, .. }
        ));
        // Its pod just turned Ready after a start or an upgrade: Provisioning, not Degraded.
        let coming = tenant("Provisioning", "False", "ControlPlaneNotReady", &now);
        match unreachable(&coming, false, "TLS handshake timeout".into()) {
            Progress::ControlPlaneNotReady { detail, stuck } => {
                assert!(!stuck);
                assert!(
                    detail.contains("does not answer yet: TLS handshake timeout"),
                    "{detail}"
                );
            }
            other => panic!("expected ControlPlaneNotReady, got {other:?}"),
        }
        // Coming up for too long: Degraded all the same.
        let stuck = tenant("Provisioning", "False", "ControlPlaneNotReady", long_ago);
        assert!(matches!(
            unreachable(&stuck, false, "refused".into()),
            Progress::ControlPlaneNotReady { stuck: true, .. }
        ));
    }
}
