//! `list` and `status`: tables as kubectl prints them, or the objects as YAML or JSON.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tenantplane_api::TenantCluster;
use tenantplane_api::conditions::{MODE_SUPPORTED, READY, SYNCED};
use tenantplane_controller::build::kubeconfig;
use tenantplane_controller::names;
use tenantplane_syncer::OBJECTS_REFUSED;

use super::progress::{condition, one_line};
use super::{ListOutput, ObjectOutput, get};
use crate::format::{age, human_duration, or_none, table};
use crate::host::explain;

pub async fn list(
    client: &Client,
    namespace: Option<&str>,
    output: Option<ListOutput>,
) -> anyhow::Result<()> {
    let api: Api<TenantCluster> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let what = match namespace {
        Some(ns) => format!("TenantClusters in namespace {ns}"),
        None => "TenantClusters in all namespaces".to_string(),
    };
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| explain(e, &what))?;
    match output {
        Some(ListOutput::Json | ListOutput::Yaml) => {
            let doc = PrintedList {
                api_version: "v1",
                kind: "List",
                items: list.items.iter().map(printable).collect(),
                metadata: json!({"resourceVersion": ""}),
            };
            print_object(&doc, output == Some(ListOutput::Json))
        }
        None | Some(ListOutput::Wide) => {
            if list.items.is_empty() {
                match namespace {
                    Some(ns) => eprintln!("No TenantClusters found in namespace {ns}."),
                    None => eprintln!("No TenantClusters found."),
                }
                return Ok(());
            }
            let wide = output == Some(ListOutput::Wide);
            let mut header = vec![];
            if namespace.is_none() {
                header.push("NAMESPACE");
            }
            header.extend(["NAME", "PHASE", "MODE", "VERSION", "AGE"]);
            if wide {
                header.extend(["ENDPOINT", "REASON"]);
            }
            let rows = list
                .items
                .iter()
                .map(|tc| {
                    let status = tc.status.as_ref();
                    let mut row = vec![];
                    if namespace.is_none() {
                        row.push(tc.namespace().unwrap_or_default());
                    }
                    row.extend([
                        tc.name_any(),
                        or_none(status.and_then(|s| s.phase).map(|p| p.as_str())),
                        tc.spec.mode.to_string(),
                        tc.spec.kubernetes_version.clone(),
                        age(tc.meta().creation_timestamp.as_ref()),
                    ]);
                    if wide {
                        row.push(or_none(status.and_then(|s| s.endpoint.as_deref())));
                        row.push(or_none(reason(tc)));
                    }
                    row
                })
                .collect::<Vec<_>>();
            print!("{}", table(&header, &rows));
            Ok(())
        }
    }
}

/// The `-o wide` REASON: why the tenant is not Ready, or why it is not in sync though Ready
/// (objects its users wrote were refused), or Ready's reason when all is well.
fn reason(tc: &TenantCluster) -> Option<&str> {
    let ready = condition(tc, READY);
    let not = |c: &&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition| c.status == "False";
    ready
        .filter(not)
        .or_else(|| condition(tc, SYNCED).filter(not))
        .or(ready)
        .map(|c| c.reason.as_str())
}

/// The object as `kubectl get -o yaml` shows it: without managed fields.
fn printable(tc: &TenantCluster) -> TenantCluster {
    let mut tc = tc.clone();
    tc.metadata.managed_fields = None;
    tc
}

/// A list as `kubectl get -o yaml` shows one, fields in kubectl's order.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct PrintedList {
    api_version: &'static str,
    kind: &'static str,
    items: Vec<TenantCluster>,
    metadata: Value,
}

fn print_object<T: serde::Serialize>(value: &T, as_json: bool) -> anyhow::Result<()> {
    if as_json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!("{}", serde_yaml::to_string(value)?);
    }
    Ok(())
}

pub async fn status(
    client: &Client,
    namespace: &str,
    name: &str,
    output: Option<ObjectOutput>,
) -> anyhow::Result<()> {
    let tc = get(client, namespace, name).await?;
    if let Some(output) = output {
        return print_object(&printable(&tc), output == ObjectOutput::Json);
    }
    let expiry = admin_certificate_expiry(client, namespace, name).await;
    print!("{}", describe(&tc, expiry));
    Ok(())
}

/// When the admin certificate in the tenant's kubeconfig Secret expires (Unix seconds); `None`
/// when there is none yet or the caller may not read it.
async fn admin_certificate_expiry(client: &Client, namespace: &str, name: &str) -> Option<i64> {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(&names::kubeconfig_secret(name))
        .await
        .ok()??;
    let parsed = kubeconfig::parse(kubeconfig::stored_text(&secret)?).ok()?;
    Some(
        tenantplane_pki::lifetime(&parsed.client.cert_pem)
            .ok()?
            .not_after,
    )
}

/// The `status` view: phase, endpoint, the admin certificate's expiry when known, and the
/// conditions as a table.
fn describe(tc: &TenantCluster, admin_expiry: Option<i64>) -> String {
    let status = tc.status.clone().unwrap_or_default();
    let mut out = String::new();
    let mut field = |label: &str, value: String| {
        out.push_str(&format!("{:<12}{value}\n", format!("{label}:")));
    };
    field("Name", tc.name_any());
    field("Namespace", tc.namespace().unwrap_or_default());
    field("Phase", or_none(status.phase.map(|p| p.as_str())));
    field("Endpoint", or_none(status.endpoint.as_deref()));
    field("Mode", tc.spec.mode.to_string());
    field("Version", tc.spec.kubernetes_version.clone());
    field("Age", age(tc.meta().creation_timestamp.as_ref()));
    if let Some(at) = admin_expiry.and_then(|at| k8s_openapi::jiff::Timestamp::from_second(at).ok())
    {
        let left = at.as_second() - k8s_openapi::jiff::Timestamp::now().as_second();
        let when = if left > 0 {
            format!("in {}", human_duration(left))
        } else {
            "expired".to_string()
        };
        field(
            "Admin cert",
            format!("expires {at} ({when}; the operator renews it before)"),
        );
    }
    if tc.meta().deletion_timestamp.is_some() {
        field("Deleting", "yes (waiting for finalizers)".to_string());
    }
    if tc.status.is_none() {
        out.push_str(
            "\nNo status yet: the operator has not seen this TenantCluster (is it running?).\n",
        );
        return out;
    }
    if let (Some(observed), Some(generation)) = (status.observed_generation, tc.meta().generation)
        && observed < generation
    {
        out.push_str(&format!(
            "\nThis status describes generation {observed}; the operator has not caught up with generation {generation} yet.\n"
        ));
    }
    out.push('\n');
    // Ready, Synced and ModeSupported first, in that order, then anything else.
    let mut conditions = status.conditions;
    let rank = |t: &str| {
        [READY, SYNCED, MODE_SUPPORTED]
            .iter()
            .position(|k| *k == t)
            .unwrap_or(usize::MAX)
    };
    conditions.sort_by_key(|c| rank(&c.type_));
    let rows = conditions
        .iter()
        .map(|c| {
            vec![
                c.type_.clone(),
                c.status.clone(),
                or_none(Some(&c.reason)),
                or_none(Some(&one_line(&c.message))),
                age(Some(&c.last_transition_time)),
            ]
        })
        .collect::<Vec<_>>();
    out.push_str(&table(
        &["TYPE", "STATUS", "REASON", "MESSAGE", "AGE"],
        &rows,
    ));
    // Objects the tenant's users wrote that were refused: one per line, with its reason.
    if let Some(synced) = conditions
        .iter()
        .find(|c| c.type_ == SYNCED && c.reason == OBJECTS_REFUSED)
    {
        let mut lines = synced.message.lines();
        if let Some(head) = lines.next() {
            out.push_str(&format!("\n{head}\n"));
        }
        for line in lines {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tenant with `phase` and these conditions (type, status, reason, message).
    fn tenant(phase: &str, conditions: &[(&str, &str, &str, &str)]) -> TenantCluster {
        let conditions: Vec<Value> = conditions
            .iter()
            .map(|(t, s, r, m)| {
                json!({"type": t, "status": s, "reason": r, "message": m,
                       "lastTransitionTime": "2026-01-01T00:00:00Z"})
            })
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "tenantplane.io/v1alpha1",
            "kind": "TenantCluster",
            "metadata": {"name": "dev", "namespace": "team"},
            "spec": {"kubernetesVersion": "v1.30.4"},
            "status": {"phase": phase, "conditions": conditions},
        }))
        .unwrap()
    }

    #[test]
    fn the_wide_reason_says_why_a_ready_tenant_is_not_in_sync() {
        let refused = tenant(
            "Ready",
            &[
                ("Ready", "True", "ControlPlaneReady", "answers"),
                ("Synced", "False", OBJECTS_REFUSED, "1 object refused"),
            ],
        );
        assert_eq!(reason(&refused), Some(OBJECTS_REFUSED));
        let well = tenant(
            "Ready",
            &[
                ("Ready", "True", "ControlPlaneReady", "answers"),
                ("Synced", "True", "SyncSucceeded", "in sync"),
            ],
        );
        assert_eq!(reason(&well), Some("ControlPlaneReady"));
        let down = tenant(
            "Degraded",
            &[
                ("Ready", "False", "TenantUnreachable", "refused"),
                ("Synced", "False", "TenantUnreachable", "refused"),
            ],
        );
        assert_eq!(reason(&down), Some("TenantUnreachable"));
    }

    #[test]
    fn status_lists_each_refused_object_on_its_own_line() {
        let message = "2 objects refused, the tenant's to fix (each has a Warning Event in the tenant):\n- NotAllowed: Pod default/a: privileged\n- HostRejected: Service default/b: nodePort";
        let tc = tenant(
            "Ready",
            &[
                ("Ready", "True", "ControlPlaneReady", "answers"),
                ("Synced", "False", OBJECTS_REFUSED, message),
            ],
        );
        let text = describe(&tc, None);
        assert!(
            text.contains("\n2 objects refused, the tenant's to fix (each has a Warning Event in the tenant):\n  - NotAllowed: Pod default/a: privileged\n  - HostRejected: Service default/b: nodePort\n"),
            "{text}"
        );
    }
}
