//! The last phase: reach the tenant API server, then keep its syncer running; the syncer's
//! verdict is the Synced condition.

use std::time::Duration;

use tenantplane_api::TenantCluster;
use tenantplane_syncer::{OBJECTS_REFUSED, SYNC_STARTING, SyncerSpec, WATCH_FAILED};

use super::credentials::Kubeconfig;
use super::provision::{ControlPlane, for_too_long, waiting, was_up};
use super::resolve::Policies;
use super::settle::{self, Unsettled};
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
    let verdict = ctx.syncers.ensure(spec, watch_client).await;
    let progress = synced(tc, replacing, version, verdict);
    // Coming up (after a start, an upgrade or a wake): Ready only once a first pod would work.
    if let Progress::Synced {
        version,
        summary,
        refused,
    } = &progress
        && !was_up(tc)
        && let Some(unsettled) =
            settle::waiting_for(&tenant_client, &policies.sync_policy.spec).await
    {
        let (waiting_for, blocked) = match unsettled {
            Unsettled::Waiting(what) => (what, false),
            Unsettled::Blocked(what) => (what, true),
        };
        return Ok(Progress::Settling {
            version: version.clone(),
            summary: summary.clone(),
            refused: *refused,
            waiting_for,
            stuck: for_too_long(tc),
            blocked,
        });
    }
    Ok(progress)
}

/// What the syncer's verdict makes of the tenant, which answers with `version`. While a change
/// rolls out, a failure is on its way. So is, while the tenant comes up, a syncer still reading
/// (a loaded machine makes that longer than a reconcile waits for it) or one whose watches lost
/// the old server and reconnect after their back-off (up to 30 s): the tenant reads
/// Provisioning, not Degraded, until it has come up or that has lasted too long.
fn synced(
    tc: &TenantCluster,
    replacing: bool,
    version: String,
    verdict: Result<String, tenantplane_syncer::Failure>,
) -> Progress {
    match verdict {
        Ok(summary) => Progress::Synced {
            version,
            summary,
            refused: false,
        },
        // The tenant's users' objects refused, nothing else failing: theirs to fix, not the
        // platform's; the tenant is Ready all the same.
        Err(failure) if failure.reason == OBJECTS_REFUSED => Progress::Synced {
            version,
            summary: failure.message,
            refused: true,
        },
        Err(failure) if replacing => {
            waiting(format!("{ROLLING_OUT}; syncing: {}", failure.message))
        }
        Err(failure)
            if [SYNC_STARTING, WATCH_FAILED].contains(&failure.reason)
                && !was_up(tc)
                && !for_too_long(tc) =>
        {
            Progress::SyncStarting {
                version,
                reason: failure.reason.to_string(),
                message: failure.message,
            }
        }
        Err(failure) => Progress::SyncFailed {
            version,
            reason: failure.reason.to_string(),
            error: failure.message,
        },
    }
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

    #[test]
    fn a_syncer_still_reading_is_on_its_way_only_while_the_tenant_comes_up() {
        use tenantplane_syncer::Failure;
        let starting = || {
            Err(Failure {
                reason: SYNC_STARTING,
                message: "the syncer is reading".into(),
            })
        };
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        // Coming up (after an upgrade rolled out): Provisioning.
        let coming = tenant("Provisioning", "False", "ControlPlaneNotReady", &now);
        assert!(matches!(
            synced(&coming, false, "v1".into(), starting()),
            Progress::SyncStarting { .. }
        ));
        // Had been up, or coming up for longer than a control plane may take: a failure.
        let up = tenant("Ready", "True", "ControlPlaneReady", &now);
        let long_ago = tenant(
            "Provisioning",
            "False",
            "ControlPlaneNotReady",
            "2026-01-01T00:00:00Z",
        );
        for tc in [&up, &long_ago] {
            assert!(matches!(
                synced(tc, false, "v1".into(), starting()),
                Progress::SyncFailed { ref reason, .. } if reason == SYNC_STARTING
            ));
        }
        // A watch that lost the old server and reconnects: on its way while coming up, a failure
        // once the tenant had been up.
        let reconnecting = || {
            Err(Failure {
                reason: WATCH_FAILED,
                message: "pods: connection refused".into(),
            })
        };
        assert!(matches!(
            synced(&coming, false, "v1".into(), reconnecting()),
            Progress::SyncStarting { ref reason, .. } if reason == WATCH_FAILED
        ));
        assert!(matches!(
            synced(&up, false, "v1".into(), reconnecting()),
            Progress::SyncFailed { ref reason, .. } if reason == WATCH_FAILED
        ));
        // Any other failure while coming up is a failure; while rolling out, it waits.
        let refused = || {
            Err(Failure {
                reason: "SyncFailed",
                message: "refused".into(),
            })
        };
        assert!(matches!(
            synced(&coming, false, "v1".into(), refused()),
            Progress::SyncFailed { .. }
        ));
        assert!(matches!(
            synced(&up, true, "v1".into(), refused()),
            Progress::ControlPlaneNotReady { stuck: false, .. }
        ));
        assert_eq!(
            synced(&up, false, "v1".into(), Ok("all".into())),
            Progress::Synced {
                version: "v1".into(),
                summary: "all".into(),
                refused: false,
            }
        );
        // Only the tenant's users' objects refused: Ready, whether it was up or coming up.
        let refused = || {
            Err(Failure {
                reason: OBJECTS_REFUSED,
                message: "1 object refused".into(),
            })
        };
        for tc in [&up, &coming] {
            assert!(matches!(
                synced(tc, false, "v1".into(), refused()),
                Progress::Synced { refused: true, ref summary, .. } if summary == "1 object refused"
            ));
        }
    }
}
