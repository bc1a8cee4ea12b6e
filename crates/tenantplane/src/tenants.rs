//! The tenant user's verbs on TenantClusters: `create` (and `--wait` until Ready), `list`,
//! `status` and `delete`. Output follows kubectl: aligned tables, `-o yaml|json`, exit code 1 on
//! any error.

use std::time::Duration;

use anyhow::{Context, bail};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tenantplane_api::conditions::{self, MODE_SUPPORTED, READY, SYNCED};
use tenantplane_api::{Phase, PolicyRef, TenantCluster};
use tenantplane_controller::build::kubeconfig;
use tenantplane_controller::names;

use crate::format::{age, human_duration, or_none, show_duration, table};
use crate::host::{explain, is_not_found, program, tenant_not_found};

/// How long `create --wait` tolerates `Degraded` before it gives up: a tenant passes through it
/// when its API server is slow to answer, and stays there when something is wrong.
pub const DEGRADED_GRACE: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ListOutput {
    Yaml,
    Json,
    /// The table with ENDPOINT and the Ready condition's reason.
    Wide,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ObjectOutput {
    Yaml,
    Json,
}

/// What `create` makes: the seed example with the user's choices.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    pub name: String,
    pub version: Option<String>,
    pub isolation_profile: Option<String>,
    pub sync_policy: Option<String>,
}

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
    let tc = new_tenant(options, namespace)?;
    let what = format!("TenantCluster {name} in namespace {namespace}");
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
                "namespace {namespace} not found; create it first (`kubectl create namespace {namespace}`) or pick another with -n"
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
        Some(timeout) => wait_ready(api, &created, timeout, started).await,
    }
}

/// The watch on one object, with kube's back-off between failed attempts: `None` when it is
/// gone (or was never there).
fn watch_one(
    api: Api<TenantCluster>,
    name: &str,
) -> impl Stream<Item = Result<Option<TenantCluster>, watcher::Error>> + Send + use<> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    watcher(api, config)
        .default_backoff()
        .scan(false, |seen, event| {
            if matches!(event, Ok(watcher::Event::Init)) {
                *seen = false;
            } else if matches!(event, Ok(watcher::Event::InitApply(_))) {
                *seen = true;
            }
            futures::future::ready(Some((*seen, event)))
        })
        .filter_map(|(seen, event)| async move {
            match event {
                Ok(watcher::Event::Apply(tc) | watcher::Event::InitApply(tc)) => Some(Ok(Some(tc))),
                Ok(watcher::Event::Delete(_)) => Some(Ok(None)),
                Ok(watcher::Event::InitDone) if !seen => Some(Ok(None)),
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            }
        })
}

/// A watch error that waiting longer will not fix.
fn fatal_watch_error(error: &watcher::Error) -> Option<String> {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s,
        _ => return None,
    };
    matches!(status.code, 401 | 403).then(|| {
        format!(
            "cannot watch TenantClusters: {}; ask your cluster admin for the watch right on tenantclusters.tenantplane.io",
            status.message
        )
    })
}

fn phase_of(tc: &TenantCluster) -> Option<Phase> {
    let status = tc.status.as_ref()?;
    // A status written for an older spec says nothing about this one.
    let current = status.observed_generation >= tc.metadata.generation;
    status.phase.filter(|_| current)
}

fn condition<'a>(tc: &'a TenantCluster, type_: &str) -> Option<&'a Condition> {
    conditions::find(&tc.status.as_ref()?.conditions, type_)
}

/// What a progress line reports; a new line when any of it changes.
fn progress_key(tc: &TenantCluster) -> (Option<Phase>, Vec<(String, String)>) {
    let of = |type_| {
        condition(tc, type_)
            .map(|c| (c.status.clone(), c.reason.clone()))
            .unwrap_or_default()
    };
    (phase_of(tc), vec![of(READY), of(SYNCED)])
}

/// The message that explains where the tenant stands: the first of Ready and Synced that is not
/// True, else Ready's.
fn explaining_condition(tc: &TenantCluster) -> Option<&Condition> {
    [READY, SYNCED]
        .iter()
        .filter_map(|t| condition(tc, t))
        .find(|c| c.status != "True")
        .or_else(|| condition(tc, READY))
}

fn progress_line(elapsed: Duration, tc: &TenantCluster) -> String {
    let phase = phase_of(tc).map_or_else(|| "(no status yet)".to_string(), |p| p.to_string());
    let part = |type_: &str| match condition(tc, type_) {
        Some(c) => format!("{type_} {} ({})", c.status, c.reason),
        None => format!("{type_} -"),
    };
    let mut line = format!(
        "{:>4}s  {phase}: {}, {}",
        elapsed.as_secs(),
        part(READY),
        part(SYNCED)
    );
    if let Some(c) = explaining_condition(tc).filter(|c| !c.message.is_empty()) {
        line.push_str(": ");
        line.push_str(&one_line(&c.message));
    }
    line
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `Provisioning, ControlPlaneNotReady: pod dev-0 is Pending`: where the tenant stands.
fn last_word(tc: &TenantCluster) -> String {
    let Some(phase) = phase_of(tc) else {
        return "no status yet (is the operator running?)".to_string();
    };
    match explaining_condition(tc) {
        Some(c) => format!("{phase}, {}", reason_and_message(c)),
        None => phase.to_string(),
    }
}

fn reason_and_message(c: &Condition) -> String {
    format!("{}: {}", c.reason, one_line(&c.message))
}

/// Follow the tenant with a watch, a line per change of phase or of the Ready/Synced reasons,
/// until it is Ready; an error when it stays Degraded past the grace or the time runs out.
async fn wait_ready(
    api: Api<TenantCluster>,
    created: &TenantCluster,
    timeout: Duration,
    started: tokio::time::Instant,
) -> anyhow::Result<()> {
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
                    "TenantCluster {name} in namespace {namespace} is not Ready after {}: {}",
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
                "TenantCluster {name} in namespace {namespace} was deleted while waiting for it to become Ready"
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
            degraded_since.get_or_insert_with(tokio::time::Instant::now);
        } else {
            degraded_since = None;
        }
        latest = tc;
        if phase == Some(Phase::Ready) {
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
            return Ok(());
        }
    }
}

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
        Some(ListOutput::Json) | Some(ListOutput::Yaml) => {
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
                        row.push(or_none(condition(tc, READY).map(|c| c.reason.as_str())));
                    }
                    row
                })
                .collect::<Vec<_>>();
            print!("{}", table(&header, &rows));
            Ok(())
        }
    }
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

/// TenantCluster `name`, or an error that says it is not there and how to list the tenants.
pub async fn get(client: &Client, namespace: &str, name: &str) -> anyhow::Result<TenantCluster> {
    let api: Api<TenantCluster> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(tc)) => Ok(tc),
        Ok(None) => Err(tenant_not_found(name, namespace)),
        Err(e) => Err(explain(
            e,
            &format!("TenantCluster {name} in namespace {namespace}"),
        )),
    }
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
    let mut conditions = status.conditions.clone();
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
    out
}

pub async fn delete(
    client: &Client,
    namespace: &str,
    name: &str,
    wait: Option<Duration>,
) -> anyhow::Result<()> {
    let started = tokio::time::Instant::now();
    let api: Api<TenantCluster> = Api::namespaced(client.clone(), namespace);
    let what = format!("TenantCluster {name} in namespace {namespace}");
    let deleting = match api.delete(name, &DeleteParams::default()).await {
        Ok(either) => either,
        Err(e) if is_not_found(&e) => return Err(tenant_not_found(name, namespace)),
        Err(e) => return Err(explain(e, &what)),
    };
    // Gone at once when no finalizer holds it; else the object, now with a deletion timestamp.
    let Some(tc) = deleting.left() else {
        println!("{what} deleted");
        return Ok(());
    };
    let Some(timeout) = wait else {
        println!(
            "{what} is being deleted; its control plane, kubeconfig and isolation objects go with it (add --wait to wait for it)"
        );
        return Ok(());
    };
    println!("{what} is being deleted; waiting for the operator to clean up");
    let uid = tc.uid();
    let mut latest = tc;
    let mut updates = watch_one(api, name).boxed();
    let deadline = started + timeout;
    loop {
        let update = tokio::select! {
            update = updates.next() => update,
            _ = tokio::time::sleep_until(deadline) => {
                let finalizers = latest.finalizers().join(", ");
                bail!(
                    "{what} is still there after {}, held by finalizers [{finalizers}]; the operator removes tenantplane.io/cleanup: is it running?",
                    show_duration(timeout)
                );
            }
        };
        match update {
            None => bail!("the watch on {what} ended"),
            Some(Err(e)) => {
                if let Some(fatal) = fatal_watch_error(&e) {
                    bail!(fatal);
                }
            }
            Some(Ok(Some(tc))) if tc.uid() == uid => latest = tc,
            Some(Ok(_)) => {
                println!("{what} deleted after {}s", started.elapsed().as_secs());
                return Ok(());
            }
        }
    }
}

/// The namespace from `-n`, else the kubeconfig context's (else `default`).
pub fn namespace_or_default(client: &Client, namespace: Option<String>) -> String {
    namespace.unwrap_or_else(|| client.default_namespace().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_starts_from_the_seed_example() {
        let options = CreateOptions {
            name: "web".into(),
            version: None,
            isolation_profile: None,
            sync_policy: None,
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
                "controlPlane": {"replicas": 1, "datastore": {"type": "sqlite"}},
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
        };
        let tc = new_tenant(&options, "team-web").unwrap();
        assert_eq!(tc.spec.kubernetes_version, "v1.31.0");
        assert_eq!(tc.spec.isolation_profile_ref.name, "baseline");
        assert_eq!(tc.spec.sync_policy_ref.name, "minimal");
    }
}
