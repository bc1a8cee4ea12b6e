//! The control plane's phase of a reconcile: its two Services, the host's Service range, the
//! StatefulSet (recreated, orphaning its pod and claim, when its governing Service changes), and
//! what its pod says. It ends with a Ready pod, or with the progress to report. Also the
//! tenant's data claims, which go with it on deletion.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, Preconditions, PropagationPolicy};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tenantplane_api::{Distribution, IsolationProfile, TenantCluster};

use std::time::Duration;

use super::report::publish;
use super::{Phase, credentials, stop};
use crate::Error;
use crate::apply::{self, Outcome};
use crate::build::{self, layout::Addressing};
use crate::context::Context;
use crate::names;
use crate::observe;
use crate::service_range;
use crate::status::Progress;
use crate::tenant_pki::TenantPki;

/// How long a control plane may take to become Ready before the tenant counts as Degraded.
pub const PROVISION_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// A control plane whose pod is Ready: the tenant can be reached.
pub(crate) struct ControlPlane {
    pub pod: Pod,
    pub addressing: Addressing,
    /// The StatefulSet rolls out a change (the pod may be about to go).
    pub rolling: bool,
    /// When the components' certificates are due (the `kubernetes` distribution's).
    pub certificates_due_in: Option<Duration>,
}

/// The control plane is on its way (not stuck): `detail` says what it waits for.
pub(crate) fn waiting(detail: String) -> Progress {
    Progress::ControlPlaneNotReady {
        detail,
        stuck: false,
    }
}

pub(crate) async fn control_plane(
    tc: &TenantCluster,
    ctx: &Context,
    profile: &IsolationProfile,
    pki: &TenantPki,
) -> Phase<ControlPlane> {
    let (tenant, ns) = build::identity(tc)?;
    let Applied {
        addressing,
        certificates_due_in,
        live,
        outcome,
    } = apply(tc, ctx, profile, pki, Running::Up).await?;
    let caches = &ctx.caches;
    let image = build::control_plane::images(tc, &ctx.options.build).join(", ");
    // Observe the control-plane pod.
    let pod_name = names::control_plane_pod(&tenant);
    let pod = crate::cache::get(&caches.pods, Some(&ns), &pod_name);
    // A new version rolling out is Provisioning, however long the tenant has been up.
    let rolling = outcome == Outcome::Updated || live.as_deref().is_none_or(observe::rolling_out);
    if let Some(pod) = pod.as_ref().filter(|p| observe::pod_is_ready(p)) {
        return Ok(ControlPlane {
            pod: (**pod).clone(),
            addressing,
            rolling,
            certificates_due_in,
        });
    }
    if let Some((reason, detail)) = pod.as_ref().and_then(|p| {
        let advice = observe::pull_advice(tc.spec.control_plane.distribution);
        observe::failing(p, &image, &tc.spec.kubernetes_version, advice)
    }) {
        return stop(Progress::ControlPlaneFailing { reason, detail });
    }
    let detail = match &pod {
        Some(p) => format!(
            "waiting for pod {pod_name} to become Ready ({})",
            observe::pod_summary(p)
        ),
        None => format!("waiting for the StatefulSet to create pod {pod_name}"),
    };
    // A tenant waking up starts again: as long as a first start may take, from the wake.
    if let Some(since) = waking_since(tc) {
        let woke = k8s_openapi::jiff::Timestamp::now()
            .duration_since(since)
            .as_secs();
        if woke <= PROVISION_TIMEOUT.as_secs() as i64 {
            return stop(waiting(format!("waking up: {detail}")));
        }
    }
    // ... for as long as a first start may take, counted from when Ready last changed.
    if rolling && !for_too_long(tc) {
        return stop(waiting(detail));
    }
    let age = tc
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| {
            k8s_openapi::jiff::Timestamp::now()
                .duration_since(t.0)
                .as_secs()
        })
        .unwrap_or(0);
    let stuck = was_up(tc) || age > PROVISION_TIMEOUT.as_secs() as i64;
    stop(Progress::ControlPlaneNotReady { detail, stuck })
}

/// Whether the control plane should run, or sleep (scaled to zero, everything else kept).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Running {
    Up,
    Asleep,
}

/// What [`apply`] made of the control plane's objects.
pub(crate) struct Applied {
    pub addressing: Addressing,
    pub certificates_due_in: Option<Duration>,
    live: Option<std::sync::Arc<StatefulSet>>,
    outcome: Outcome,
}

/// The control plane's objects as they should be: Services, configuration, certificates and
/// the StatefulSet, at one replica or, asleep, none (a new version or certificate still lands
/// in its template, and runs on wake).
pub(crate) async fn apply(
    tc: &TenantCluster,
    ctx: &Context,
    profile: &IsolationProfile,
    pki: &TenantPki,
    running: Running,
) -> Phase<Applied> {
    let (tenant, ns) = build::identity(tc)?;
    let client = &ctx.client;
    let caches = &ctx.caches;
    let options = &ctx.options.build;
    let api_ip = apply_services(tc, ctx, running).await?;
    let addressing = addressing(ctx, &ns, api_ip).await?;

    // What the pod reads at start: its admission configuration (a new level rolls it) and, for
    // the `kubernetes` distribution, the certificates the operator issues for its components.
    let config = build::admission::config_map(tc, profile.spec.pod_security)?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    apply::ensure(&config_maps, &caches.config_maps, &config).await?;
    let certificates_due_in = match tc.spec.control_plane.distribution {
        Distribution::Kubernetes => {
            Some(credentials::component_certificates(tc, ctx, pki, &addressing).await?)
        }
        Distribution::K3s => None,
    };

    let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), &ns);
    let mut desired = build::control_plane::desired_statefulset(
        tc,
        &addressing,
        options,
        &build::admission::digest(&config),
    )?;
    if running == Running::Asleep
        && let Some(spec) = desired.spec.as_mut()
    {
        spec.replicas = Some(0);
    }
    let live = crate::cache::get(
        &caches.statefulsets,
        Some(&ns),
        &names::statefulset(&tenant),
    );
    if let Some(live) = &live {
        keep_governing_service(tc, ctx, &statefulsets, live, &desired).await?;
    }
    let outcome = apply::ensure(&statefulsets, &caches.statefulsets, &desired).await?;
    let image = build::control_plane::images(tc, options).join(", ");
    if outcome == Outcome::Created {
        publish(
            ctx,
            tc,
            EventType::Normal,
            "ControlPlaneCreated",
            format!("created StatefulSet {tenant} running {image}"),
        )
        .await;
    }

    Ok(Applied {
        addressing,
        certificates_due_in,
        live,
        outcome,
    })
}

/// The control plane's Services, as they should be for `running`: the tenant API's address once
/// its Service has one.
async fn apply_services(tc: &TenantCluster, ctx: &Context, running: Running) -> Phase<String> {
    let (tenant, ns) = build::identity(tc)?;
    let caches = &ctx.caches;
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let service_name = names::service(&tenant);
    let live_service = crate::cache::get(&caches.services, Some(&ns), &service_name);
    let cluster_ip = live_service
        .as_ref()
        .and_then(|s| s.spec.as_ref()?.cluster_ip.clone());
    if cluster_ip.as_deref() == Some("None") {
        // A headless Service (as early versions made) cannot take a cluster IP: replace it.
        apply::ensure_absent(&services, &caches.services, &ns, &service_name).await?;
        let detail =
            format!("replacing the headless Service {service_name} with one that has a cluster IP");
        return stop(waiting(detail));
    }
    // Asleep with a wake door, the Service leads to the door's EndpointSlice, not the pod.
    let service = match running {
        Running::Asleep if ctx.options.wake.is_some() => {
            build::services::desired_sleeping_service(tc)?
        }
        _ => build::services::desired_service(tc)?,
    };
    apply::ensure(&services, &caches.services, &service).await?;
    apply::ensure(
        &services,
        &caches.services,
        &build::services::desired_headless_service(tc)?,
    )
    .await?;
    let Some(api_ip) = cluster_ip.filter(|ip| !ip.is_empty()) else {
        // The Service's watch brings the tenant back once the address is allocated.
        let detail = format!("waiting for Service {service_name} to get its cluster IP");
        return stop(waiting(detail));
    };
    Ok(api_ip)
}

/// The tenant API's address with the host's range that holds it. The range the tenant allocates
/// from is the host's; a disagreement builds nothing more. A running syncer is left alone: it
/// never forces an address outside its range on a tenant Service, and stopping it would take
/// the tenant's workloads off the host.
async fn addressing(ctx: &Context, ns: &str, api_ip: String) -> Phase<Addressing> {
    let flag = ctx.options.build.service_cidr.as_deref();
    let mut chosen = service_cidr(ctx, ns, &api_ip, flag).await;
    if chosen.is_err() {
        // A range added since it was remembered may hold the address: ask again, once.
        ctx.service_ranges.forget();
        chosen = service_cidr(ctx, ns, &api_ip, flag).await;
    }
    match chosen {
        Ok(service_cidr) => Ok(Addressing {
            api_ip,
            service_cidr,
        }),
        Err((reason, detail)) => stop(Progress::ServiceRange { reason, detail }),
    }
}

/// A StatefulSet's serviceName cannot change: when `desired` names another, the live one is
/// deleted but not its pod and claim, which the new one adopts, data and all, and the phase
/// stops until it is gone.
async fn keep_governing_service(
    tc: &TenantCluster,
    ctx: &Context,
    statefulsets: &Api<StatefulSet>,
    live: &StatefulSet,
    desired: &StatefulSet,
) -> Phase<()> {
    let wanted = desired.spec.as_ref().and_then(|s| s.service_name.clone());
    let has = live.spec.as_ref().and_then(|s| s.service_name.clone());
    if has == wanted {
        return Ok(());
    }
    if live.meta().deletion_timestamp.is_none() {
        // Only the object we looked at: a cache behind a recreate must not delete the new one.
        let orphan = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Orphan),
            preconditions: Some(Preconditions {
                uid: live.uid(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match statefulsets.delete(&live.name_any(), &orphan).await {
            Ok(_) => {}
            // Gone already, or replaced: the watch brings the next step.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(error) => {
                return Err(Error::Write {
                    object: format!(
                        "deleting StatefulSet {}/{} (orphaning its pod)",
                        live.namespace().unwrap_or_default(),
                        live.name_any()
                    ),
                    error,
                }
                .into());
            }
        }
        publish(
            ctx,
            tc,
            EventType::Normal,
            "RecreatingStatefulSet",
            format!(
                "recreating StatefulSet {} with governing Service {} (was {}); its pod and data volume stay",
                live.name_any(),
                wanted.as_deref().unwrap_or_default(),
                has.as_deref().unwrap_or_default()
            ),
        )
        .await;
    }
    stop(waiting(format!(
        "recreating StatefulSet {} with governing Service {}",
        live.name_any(),
        wanted.unwrap_or_default()
    )))
}

/// The host's range that holds `api_ip`, checked against the operator's flag; the reason and
/// sentence for status when there is none.
async fn service_cidr(
    ctx: &Context,
    namespace: &str,
    api_ip: &str,
    flag: Option<&str>,
) -> Result<String, (&'static str, String)> {
    ctx.service_ranges
        .host_range(&ctx.client, namespace)
        .await
        .and_then(|range| service_range::choose(&range, api_ip, flag))
        .map_err(|e| (e.label(), e.to_string()))
}

/// When the tenant began to wake, while it does.
fn waking_since(tc: &TenantCluster) -> Option<k8s_openapi::jiff::Timestamp> {
    Some(tc.status.as_ref()?.sleep.as_ref()?.waking_since.as_ref()?.0)
}

/// Whether Ready has kept its status for longer than a control plane may take to come up.
pub(super) fn for_too_long(tc: &TenantCluster) -> bool {
    tc.status
        .as_ref()
        .and_then(|s| {
            tenantplane_api::conditions::find(&s.conditions, tenantplane_api::conditions::READY)
        })
        .is_some_and(|c| {
            k8s_openapi::jiff::Timestamp::now()
                .duration_since(c.last_transition_time.0)
                .as_secs()
                > PROVISION_TIMEOUT.as_secs() as i64
        })
}

/// Whether the control plane had come up: Ready was True, or it went Degraded because it went
/// away (and stays so until it is back). Going away can first read as an API server that does
/// not answer while its pod is still Ready; the pod's readiness then follows, and the tenant
/// must stay Degraded rather than fall back to Provisioning.
pub(super) fn was_up(tc: &TenantCluster) -> bool {
    let Some(status) = tc.status.as_ref() else {
        return false;
    };
    let ready =
        tenantplane_api::conditions::find(&status.conditions, tenantplane_api::conditions::READY);
    ready.is_some_and(|c| {
        c.status == "True"
            || (status.phase == Some(tenantplane_api::Phase::Degraded)
                && ["ControlPlaneNotReady", "TenantUnreachable"].contains(&c.reason.as_str()))
    })
}

/// The tenant's data claims, deleted with it: the StatefulSet's retention policy does so, and this
/// catches claims made before the policy (or left by a StatefulSet deleted with orphaning). Only
/// claims named after the tenant's StatefulSet and labelled as its control plane's are touched.
pub(crate) async fn delete_data_claims(tc: &TenantCluster, ctx: &Context) -> Result<usize, Error> {
    let (tenant, ns) = build::identity(tc)?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let selector = names::selector(&names::control_plane_selector(&tenant));
    let prefix = format!("{}-{}-", names::DATA_VOLUME, names::statefulset(&tenant));
    let mut deleted = 0;
    for claim in claims
        .list(&ListParams::default().labels(&selector))
        .await?
    {
        let name = claim.name_any();
        let ordinal = name.strip_prefix(&prefix);
        if claim.metadata.deletion_timestamp.is_some()
            || !ordinal.is_some_and(|o| !o.is_empty() && o.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        match claims.delete(&name, &DeleteParams::background()).await {
            Ok(_) => deleted += 1,
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A tenant in `phase` whose Ready condition is `ready` for `reason`, since `since`.
    pub(in crate::phases) fn tenant_since(
        phase: &str,
        ready: &str,
        reason: &str,
        since: &str,
    ) -> TenantCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "tenantplane.io/v1alpha1", "kind": "TenantCluster",
            "metadata": {"name": "dev", "namespace": "team-dev"},
            "spec": {"kubernetesVersion": "v1.31.4"},
            "status": {"phase": phase, "conditions": [{
                "type": "Ready", "status": ready, "reason": reason, "message": "m",
                "lastTransitionTime": since
            }]}
        }))
        .unwrap()
    }

    fn tenant(phase: &str, ready: &str, reason: &str) -> TenantCluster {
        tenant_since(phase, ready, reason, "2026-12-06T22:42:42Z")
    }

    #[test]
    fn a_tenant_that_was_up_stays_up_through_every_way_of_going_away() {
        assert!(was_up(&tenant("Ready", "True", "ControlPlaneReady")));
        assert!(was_up(&tenant("Degraded", "True", "ControlPlaneReady")));
        assert!(was_up(&tenant("Degraded", "False", "ControlPlaneNotReady")));
        assert!(was_up(&tenant("Degraded", "False", "TenantUnreachable")));
        assert!(!was_up(&tenant(
            "Provisioning",
            "False",
            "ControlPlaneNotReady"
        )));
        assert!(!was_up(&tenant("Degraded", "False", "PolicyMissing")));
        assert!(!was_up(&tenant("Pending", "Unknown", "Accepted")));
    }
}
