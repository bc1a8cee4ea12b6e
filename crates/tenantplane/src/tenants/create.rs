//! `create`: the seed example with the user's choices, and `--wait` until it is Ready.

use std::time::Duration;

use anyhow::{Context, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use tenantplane_api::conditions::READY;
use tenantplane_api::{Distribution, Phase, PolicyRef, TenantCluster};

use super::progress::{
    condition, explaining_condition, fatal_watch_error, last_word, phase_of, progress_key,
    progress_line, reason_and_message, watch_one,
};
use crate::format::show_duration;
use crate::host::{explain, program};

/// How long `create --wait` tolerates `Degraded` before it gives up: a tenant passes through it
/// when its API server is slow to answer, and stays there when something is wrong.
pub const DEGRADED_GRACE: Duration = Duration::from_secs(20);

/// What `create` makes: the seed example with the user's choices.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    pub name: String,
    pub version: Option<String>,
    pub isolation_profile: Option<String>,
    pub sync_policy: Option<String>,
    /// `k3s` or `kubernetes` (`--distribution`; clap offers only those).
    pub distribution: Option<String>,
    /// Build it from this TenantSnapshot (in the same namespace).
    pub from_snapshot: Option<String>,
    /// Create the namespace when it does not exist (`--create-namespace`).
    pub create_namespace: bool,
    /// Keep the TenantCluster when `--wait` meets a failure waiting will not fix (`--keep`).
    pub keep: bool,
}

/// The Ready reasons of a failure waiting will not fix: someone must change something (another
/// tenant holds the namespace, a policy is missing, the PKI Secret or the Service range is
/// wrong). `create --wait` exits at once on one.
pub const PERMANENT: &[&str] = &[
    "NamespaceInUse",
    "IsolationProfileNotFound",
    "SyncPolicyNotFound",
    "PKIInvalid",
    "ServiceCIDRMismatch",
];

/// `wait_for_phase` met a failure waiting will not fix ([`PERMANENT`]).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Permanent(String);

/// The TenantCluster `create` submits.
pub fn new_tenant(options: &CreateOptions, namespace: &str) -> anyhow::Result<TenantCluster> {
    // The seed example (`examples/tenantcluster-dev.yaml`) gives every default.
    let mut tc: TenantCluster = serde_yaml::from_str(crate::manifests::EXAMPLE_TENANT)
        .context("reading the built-in example TenantCluster")?;
    tc.metadata = kube::api::ObjectMeta {
        name: Some(options.name.clone()),
        namespace: Some(namespace.to_string()),
        ..Default::default()
    };
    if let Some(version) = &options.version {
        tc.spec.kubernetes_version = version.clone();
    }
    if let Some(profile) = &options.isolation_profile {
        tc.spec.isolation_profile_ref = PolicyRef::named(profile);
    }
    if let Some(policy) = &options.sync_policy {
        tc.spec.sync_policy_ref = PolicyRef::named(policy);
    }
    if let Some(name) = &options.distribution {
        tc.spec.control_plane.distribution = Distribution::ALL
            .iter()
            .copied()
            .find(|d| d.as_str() == name)
            .with_context(|| format!("--distribution {name}: not one of k3s, kubernetes"))?;
    }
    if let Some(snapshot) = &options.from_snapshot {
        tc.spec.restore = Some(tenantplane_api::Restore {
            snapshot_ref: tenantplane_api::SnapshotRef {
                name: snapshot.clone(),
                namespace: None,
            },
            requested_at: None,
        });
    }
    Ok(tc)
}

pub async fn create(
    client: &Client,
    namespace: &str,
    options: &CreateOptions,
    wait: Option<Duration>,
) -> anyhow::Result<()> {
    let started = tokio::time::Instant::now();
    let name = &options.name;
    let api: Api<TenantCluster> = Api::namespaced(client.clone(), namespace);
    let mut tc = new_tenant(options, namespace)?;
    if let Some(snapshot) = &options.from_snapshot {
        let snap = super::restore::completed_snapshot(client, namespace, snapshot).await?;
        // The snapshot's own version unless one is asked: a tenant never reads back the data of
        // a newer minor.
        let taken_at = snap
            .status
            .as_ref()
            .and_then(|s| s.kubernetes_version.as_deref())
            .map(|v| v.split('+').next().unwrap_or(v).to_string());
        if options.version.is_none()
            && let Some(version) = taken_at
        {
            tc.spec.kubernetes_version = version;
        }
    }
    let what = format!("TenantCluster {name} in namespace {namespace}");
    if options.create_namespace {
        ensure_namespace(client, namespace).await?;
    }
    let created = match api.create(&PostParams::default(), &tc).await {
        Ok(created) => created,
        Err(kube::Error::Api(status)) if status.code == 409 => bail!(
            "TenantCluster {name} already exists in namespace {namespace}; see it with `{} status {name} -n {namespace}`",
            program()
        ),
        Err(kube::Error::Api(status))
            if status.code == 404
                && status
                    .details
                    .as_ref()
                    .is_some_and(|d| d.kind == "namespaces") =>
        {
            bail!(
                "namespace {namespace} not found; add --create-namespace, create it first (`kubectl create namespace {namespace}`) or pick another with -n"
            )
        }
        Err(kube::Error::Api(status)) if status.code == 422 || status.code == 400 => {
            bail!("the API server refused {what}: {}", status.message.trim())
        }
        Err(e) => return Err(explain(e, &what)),
    };
    println!("TenantCluster {name} created in namespace {namespace}");
    match wait {
        None => {
            println!(
                "Follow it with `{} status {name} -n {namespace}`, or create with --wait",
                program()
            );
            Ok(())
        }
        Some(timeout) => match wait_ready(api.clone(), &created, timeout, started).await {
            Err(e) if e.is::<Permanent>() && !options.keep => {
                let deleted = match api.delete(name, &Default::default()).await {
                    Ok(_) => format!("{what} is deleted (add --keep to keep it)"),
                    Err(d) => format!("deleting {what} failed too: {}", explain(d, &what)),
                };
                bail!("{e}\n{deleted}")
            }
            done => done,
        },
    }
}

/// Create namespace `name` unless it exists (`--create-namespace`).
async fn ensure_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    match namespaces.create(&PostParams::default(), &namespace).await {
        Ok(_) => {
            println!("namespace {name} created");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(explain(e, &format!("namespace {name}"))),
    }
}

/// Follow the tenant until it is Ready, then say how to use it.
async fn wait_ready(
    api: Api<TenantCluster>,
    created: &TenantCluster,
    timeout: Duration,
    started: tokio::time::Instant,
) -> anyhow::Result<()> {
    let latest = wait_for_phase(api, created, Phase::Ready, timeout, started).await?;
    let (name, namespace) = (latest.name_any(), latest.namespace().unwrap_or_default());
    let endpoint = latest
        .status
        .as_ref()
        .and_then(|s| s.endpoint.clone())
        .unwrap_or_default();
    println!(
        "TenantCluster {name} in namespace {namespace} is Ready after {}s at {endpoint}",
        started.elapsed().as_secs()
    );
    println!(
        "Use it: `{} kubeconfig {name} -n {namespace} --merge`",
        program()
    );
    Ok(())
}

/// Follow the tenant with a watch, a line per change of phase or of the Ready/Synced reasons,
/// until its phase is `want`; an error when it stays Degraded past the grace or the time runs
/// out. `create`, `sleep` and `wake` wait with it.
pub(super) async fn wait_for_phase(
    api: Api<TenantCluster>,
    created: &TenantCluster,
    want: Phase,
    timeout: Duration,
    started: tokio::time::Instant,
) -> anyhow::Result<TenantCluster> {
    let name = created.name_any();
    let namespace = created.namespace().unwrap_or_default();
    let uid = created.uid();
    let deadline = started + timeout;
    let mut updates = watch_one(api, &name).boxed();
    let mut last_key = None;
    let mut latest = created.clone();
    let mut degraded_since: Option<tokio::time::Instant> = None;
    let mut watch_error: Option<String> = None;
    loop {
        let wake = match degraded_since {
            Some(since) => deadline.min(since + DEGRADED_GRACE),
            None => deadline,
        };
        let update = tokio::select! {
            update = updates.next() => update,
            _ = tokio::time::sleep_until(wake) => {
                if degraded_since.is_some() && wake < deadline {
                    let why = explaining_condition(&latest)
                        .map(reason_and_message)
                        .unwrap_or_default();
                    bail!(
                        "TenantCluster {name} in namespace {namespace} stayed Degraded for {}: {why}; see `{} status {name} -n {namespace}`",
                        show_duration(DEGRADED_GRACE),
                        program()
                    );
                }
                let mut message = format!(
                    "TenantCluster {name} in namespace {namespace} is not {want} after {}: {}",
                    show_duration(timeout),
                    last_word(&latest)
                );
                if let Some(e) = &watch_error {
                    message.push_str(&format!(" (the watch last failed with: {e})"));
                }
                message.push_str(&format!("; see `{} status {name} -n {namespace}`", program()));
                bail!(message);
            }
        };
        let tc = match update {
            None => bail!("the watch on TenantCluster {name} in namespace {namespace} ended"),
            Some(Err(e)) => {
                if let Some(fatal) = fatal_watch_error(&e) {
                    bail!(fatal);
                }
                watch_error = Some(tenantplane_controller::error_chain(&e));
                continue;
            }
            Some(Ok(None)) => bail!(
                "TenantCluster {name} in namespace {namespace} was deleted while waiting for it to become {want}"
            ),
            Some(Ok(Some(tc))) if tc.uid() != uid => bail!(
                "TenantCluster {name} in namespace {namespace} was deleted and created again while waiting for it"
            ),
            Some(Ok(Some(tc))) => tc,
        };
        watch_error = None;
        let key = progress_key(&tc);
        if tc.status.is_some() && last_key.as_ref() != Some(&key) {
            println!("{}", progress_line(started.elapsed(), &tc));
            last_key = Some(key);
        }
        let phase = phase_of(&tc);
        if phase == Some(Phase::Degraded) {
            if let Some(ready) =
                condition(&tc, READY).filter(|c| PERMANENT.contains(&c.reason.as_str()))
            {
                bail!(Permanent(format!(
                    "TenantCluster {name} in namespace {namespace} is Degraded for a reason waiting will not fix: {}; see `{} status {name} -n {namespace}`",
                    reason_and_message(ready),
                    program()
                )));
            }
            degraded_since.get_or_insert_with(tokio::time::Instant::now);
        } else {
            degraded_since = None;
        }
        latest = tc;
        if phase == Some(want) {
            return Ok(latest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn create_starts_from_the_seed_example() {
        let options = CreateOptions {
            name: "web".into(),
            version: None,
            isolation_profile: None,
            sync_policy: None,
            distribution: None,
            from_snapshot: None,
            create_namespace: false,
            keep: false,
        };
        let tc = new_tenant(&options, "team-web").unwrap();
        assert_eq!(tc.name_any(), "web");
        assert_eq!(tc.namespace().as_deref(), Some("team-web"));
        let spec = serde_json::to_value(&tc.spec).unwrap();
        assert_eq!(
            spec,
            json!({
                "mode": "shared",
                "kubernetesVersion": "v1.30.4",
                "isolationProfileRef": {"name": "restricted"},
                "syncPolicyRef": {"name": "default"},
                "controlPlane": {"distribution": "k3s", "replicas": 1, "datastore": {"type": "sqlite"}},
                "networking": {"egressPolicy": "deny-by-default"},
                "migration": {"allowModeChange": true},
                "resources": {"cpu": "2", "memory": "2Gi"},
            })
        );

        let options = CreateOptions {
            name: "web".into(),
            version: Some("v1.31.0".into()),
            isolation_profile: Some("baseline".into()),
            sync_policy: Some("minimal".into()),
            distribution: Some("kubernetes".into()),
            from_snapshot: None,
            create_namespace: false,
            keep: false,
        };
        let tc = new_tenant(&options, "team-web").unwrap();
        assert_eq!(tc.spec.control_plane.distribution, Distribution::Kubernetes);
        assert_eq!(tc.spec.kubernetes_version, "v1.31.0");
        assert_eq!(tc.spec.isolation_profile_ref.name, "baseline");
        assert_eq!(tc.spec.sync_policy_ref.name, "minimal");
    }
}
