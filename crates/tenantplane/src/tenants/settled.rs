//! What `--wait` waits for once the TenantCluster says it is done: the host namespace settled.
//! A deleted TenantCluster is gone before its pods and claims are (the garbage collector and the
//! kubelets take them after it, Terminating for up to their grace period), and a Sleeping one
//! before its pods have left; a script that goes on at once would meet them.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::bail;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tenantplane_controller::names;
use tenantplane_syncer::naming;

use crate::host::explain;

/// What must have left the host namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Leaving {
    /// Every pod and claim of the tenant's (a deleted tenant).
    PodsAndClaims,
    /// Every pod of the tenant's (a sleeping tenant keeps its claims).
    Pods,
}

/// How often the host namespace is looked at.
const EVERY: Duration = Duration::from_secs(1);

/// The names of the objects of `K` in `namespace` that tenant `name` made (its control plane's,
/// labelled with the tenant) or that its syncer copied (labelled as synced from it).
async fn names_left<K>(
    client: &Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<BTreeSet<String>>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let mut left = BTreeSet::new();
    for selector in [
        format!("{}={name}", names::LABEL_TENANT),
        naming::synced_selector(name),
    ] {
        let list = api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| {
                explain(
                    e,
                    &format!("the {} of namespace {namespace}", K::plural(&())),
                )
            })?;
        left.extend(list.items.iter().map(|o| o.name_any()));
    }
    Ok(left)
}

/// `3 pods and 1 claim`, or `1 pod`.
fn count(pods: usize, claims: usize, leaving: Leaving) -> String {
    let of = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    match leaving {
        Leaving::Pods => of(pods, "pod"),
        Leaving::PodsAndClaims => format!("{} and {}", of(pods, "pod"), of(claims, "claim")),
    }
}

/// Wait until host namespace `namespace` holds none of tenant `name`'s pods (and claims, when
/// `leaving` says so), printing a line each time the count changes; an error naming what is
/// left once `deadline` passes.
pub(super) async fn until_left(
    client: &Client,
    namespace: &str,
    name: &str,
    leaving: Leaving,
    deadline: tokio::time::Instant,
    started: tokio::time::Instant,
) -> anyhow::Result<()> {
    let mut last = None;
    loop {
        let pods = names_left::<Pod>(client, namespace, name).await?;
        let claims = match leaving {
            Leaving::PodsAndClaims => {
                names_left::<PersistentVolumeClaim>(client, namespace, name).await?
            }
            Leaving::Pods => BTreeSet::new(),
        };
        if pods.is_empty() && claims.is_empty() {
            return Ok(());
        }
        let now = (pods.len(), claims.len());
        if last != Some(now) {
            println!(
                "{:>4}s  waiting for {} of the tenant's to leave namespace {namespace}",
                started.elapsed().as_secs(),
                count(now.0, now.1, leaving)
            );
            last = Some(now);
        }
        if tokio::time::Instant::now() >= deadline {
            let names: Vec<&String> = pods.iter().chain(&claims).take(5).collect();
            bail!(
                "namespace {namespace} still holds {} of TenantCluster {name}'s ({names:?}…); see `kubectl get pods,pvc -n {namespace} -l {}={name}`",
                count(now.0, now.1, leaving),
                names::LABEL_TENANT
            );
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// How a tenant pod's host copy stands, for [`until_running_again`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Copy {
    /// Running, of this very tenant pod (not a copy of an older one of the same name).
    Running,
    /// Missing, Terminating, of an older pod, or not Running yet.
    NotYet,
}

/// How `copy` stands for tenant pod `uid`.
fn copy_of(uid: &str, copy: Option<&Pod>) -> Copy {
    let Some(copy) = copy else {
        return Copy::NotYet;
    };
    let theirs = copy
        .annotations()
        .get(naming::ANNOTATION_VIRTUAL_UID)
        .is_some_and(|u| u == uid);
    let running = copy.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    if theirs && running && copy.metadata.deletion_timestamp.is_none() {
        Copy::Running
    } else {
        Copy::NotYet
    }
}

/// Does tenant pod `p` wait for a host copy? Not when it is finished, going, or refused (its
/// `PodScheduled` says `NotAllowed`, `HostRejected` or `NodeRejected`: it never gets one).
fn wants_a_copy(p: &Pod) -> bool {
    let status = p.status.as_ref();
    let finished = matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    let refused = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && matches!(
                    c.reason.as_deref(),
                    Some("NotAllowed" | "HostRejected" | "NodeRejected")
                )
        });
    !finished && !refused && p.metadata.deletion_timestamp.is_none()
}

/// Wait until every tenant pod that should run has a Running host copy of its own again (after
/// a wake or a restore, the tenant still shows its pods Running while their copies are being
/// made, or the old ones Terminating), printing a line each time the count changes.
pub(super) async fn until_running_again(
    host: &Client,
    namespace: &str,
    name: &str,
    deadline: tokio::time::Instant,
    started: tokio::time::Instant,
) -> anyhow::Result<()> {
    let (tenant, _forward) = crate::connect::tenant_client(host, namespace, name).await?;
    let tenant_pods: Api<Pod> = Api::all(tenant);
    let copies: Api<Pod> = Api::namespaced(host.clone(), namespace);
    let mut last = None;
    loop {
        let wanted: Vec<Pod> = tenant_pods
            .list(&ListParams::default())
            .await
            .map_err(|e| explain(e, &format!("the pods of TenantCluster {name}")))?
            .items
            .into_iter()
            .filter(wants_a_copy)
            .collect();
        let present = copies
            .list(&ListParams::default().labels(&naming::synced_selector(name)))
            .await
            .map_err(|e| explain(e, &format!("the pods of namespace {namespace}")))?
            .items;
        let running = wanted
            .iter()
            .filter(|p| {
                let copy_name = naming::host_name_for(
                    name,
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                    &p.name_any(),
                );
                let copy = present.iter().find(|c| c.name_any() == copy_name);
                copy_of(p.metadata.uid.as_deref().unwrap_or_default(), copy) == Copy::Running
            })
            .count();
        if running == wanted.len() {
            return Ok(());
        }
        let now = (running, wanted.len());
        if last != Some(now) {
            println!(
                "{:>4}s  {running} of the tenant's {} pods run on the host again",
                started.elapsed().as_secs(),
                wanted.len()
            );
            last = Some(now);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "only {running} of TenantCluster {name}'s {} pods run on the host again; see `kubectl get pods -n {namespace} -l {}`",
                wanted.len(),
                naming::synced_selector(name)
            );
        }
        tokio::time::sleep(EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_copy_counts_once_it_runs_and_is_the_tenant_pods_own() {
        let uid = naming::ANNOTATION_VIRTUAL_UID;
        let running = |u: &str| {
            pod(serde_json::json!({
                "metadata": {"name": "web-x-default-x-dev", "annotations": {uid: u}},
                "status": {"phase": "Running"}
            }))
        };
        assert_eq!(copy_of("a", Some(&running("a"))), Copy::Running);
        assert_eq!(
            copy_of("a", Some(&running("old"))),
            Copy::NotYet,
            "an older pod's"
        );
        assert_eq!(copy_of("a", None), Copy::NotYet);
        let mut going = running("a");
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        assert_eq!(copy_of("a", Some(&going)), Copy::NotYet, "Terminating");
        let pending = pod(serde_json::json!({
            "metadata": {"annotations": {uid: "a"}}, "status": {"phase": "Pending"}
        }));
        assert_eq!(copy_of("a", Some(&pending)), Copy::NotYet);
    }

    #[test]
    fn only_pods_that_should_run_wait_for_a_copy() {
        assert!(wants_a_copy(&pod(
            serde_json::json!({"status": {"phase": "Running"}})
        )));
        assert!(!wants_a_copy(&pod(
            serde_json::json!({"status": {"phase": "Succeeded"}})
        )));
        let refused = pod(
            serde_json::json!({"status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "NotAllowed"}
            ]}}),
        );
        assert!(!wants_a_copy(&refused));
    }

    #[test]
    fn the_count_says_what_is_left_in_words() {
        assert_eq!(count(1, 0, Leaving::Pods), "1 pod");
        assert_eq!(count(3, 1, Leaving::PodsAndClaims), "3 pods and 1 claim");
        assert_eq!(count(0, 2, Leaving::PodsAndClaims), "0 pods and 2 claims");
    }
}
