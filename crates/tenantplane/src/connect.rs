//! `tenantplane connect NAME`: the tenant's API server on a local port, from anywhere the host
//! API server answers. The kubeconfig Secret names the in-cluster Service (`https://<name>.<ns>
//! .svc:6443`), which a laptop cannot reach; `connect` listens on 127.0.0.1, carries each
//! connection through the host's pods/portforward to a Ready control-plane pod, and hands out
//! the tenant's kubeconfig pointed at that port, with `tls-server-name` set to the name the
//! serving certificate carries. It either writes that kubeconfig to a file or merges it into the
//! user's kubeconfig and switches to it (as `vcluster connect` does), then stays until Ctrl-C.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use tenantplane_api::{TenantCluster, conditions};
use tenantplane_controller::{kubeconfig, names};
use tokio::net::TcpListener;

use crate::forward::{self, Target};
use crate::host::program;
use crate::kubeconfig_cmd;

/// What `connect` was asked for.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    pub name: String,
    pub namespace: String,
    pub local_port: Option<u16>,
    pub kubeconfig_out: Option<PathBuf>,
    pub context_name: Option<String>,
}

/// The context's name unless `--context-name` says otherwise: `tenantplane-<ns>-<name>`.
pub fn default_context_name(namespace: &str, name: &str) -> String {
    format!("tenantplane-{namespace}-{name}")
}

pub async fn run(client: &kube::Client, o: &ConnectOptions) -> anyhow::Result<()> {
    // Before anything is printed, so that Ctrl-C at any moment after it ends us cleanly. Until
    // the forward starts it interrupts the preparation, which changes no file before its end.
    let stop = stop_signal()?;
    tokio::pin!(stop);
    let ready = tokio::select! {
        ready = prepare(client, o) => ready?,
        () = &mut stop => bail!("interrupted before the forward started; no kubeconfig was changed"),
    };
    let Ready {
        listener,
        target,
        port,
        context,
        wrote,
    } = ready;
    println!("Press Ctrl-C to stop.");
    forward::serve(listener, target, stop).await;
    println!("Stopped forwarding 127.0.0.1:{port}.");
    match wrote {
        Wrote::Merged(file, previous) => {
            println!("{}", leave_context(&file, &context, previous.as_deref()));
        }
        Wrote::File(path) => println!(
            "{path} stays, but answers only while `{} connect` runs.",
            program()
        ),
    }
    Ok(())
}

/// What is set up before the forward runs.
struct Ready {
    listener: TcpListener,
    target: Arc<Target>,
    port: u16,
    context: String,
    wrote: Wrote,
}

/// Find the pod, take the port, write the kubeconfig: the last step, after every await.
async fn prepare(client: &kube::Client, o: &ConnectOptions) -> anyhow::Result<Ready> {
    let (ns, name) = (o.namespace.as_str(), o.name.as_str());
    crate::tenants::wake_if_asleep(client, ns, name).await?;
    let tc = crate::tenants::get(client, ns, name).await?;
    println!("Finding the API server pod of TenantCluster {name} in namespace {ns}");
    let target = Arc::new(Target::new(client, ns, name));
    let pod = target.resolve().await.map_err(|e| not_ready(&tc, e))?;
    target.remember(Some(pod.clone()));
    let listener = bind(o.local_port).await?;
    let port = listener.local_addr()?.port();
    let stored = kubeconfig_cmd::stored(client, ns, name).await?;
    let context = o
        .context_name
        .clone()
        .unwrap_or_else(|| default_context_name(ns, name));
    let text = through_local_port(&stored, port, &context)?;
    println!(
        "Forwarding 127.0.0.1:{port} to port {} of pod {pod} through the host API server",
        names::API_PORT
    );
    let wrote = match &o.kubeconfig_out {
        Some(path) => {
            kubeconfig_cmd::write_private(path, &text)?;
            let path = shown(path);
            println!("Wrote the tenant's kubeconfig to {path} (context {context})");
            println!(
                "Use it with `kubectl --kubeconfig {path} get namespaces`, or `export KUBECONFIG={path}`"
            );
            Wrote::File(path)
        }
        None => {
            let file = kubeconfig_cmd::merge_target()?;
            let (merged, previous) = kubeconfig_cmd::update_file(&file, |existing| {
                let merged = kubeconfig_cmd::merge(existing, &text, &context)
                    .with_context(|| format!("merging into {}", file.display()))?;
                let (switched, previous) = switch_context(&merged.text, &context)?;
                Ok((switched, (merged, previous)))
            })?;
            println!(
                "Merged into {}: {}; the current context is now {context} (was {})",
                file.display(),
                kubeconfig_cmd::describe_changes(&merged, &context),
                previous.as_deref().unwrap_or("none"),
            );
            println!(
                "Use it with `kubectl get namespaces`, or from elsewhere `kubectl --context {context} get namespaces`"
            );
            Wrote::Merged(file, previous)
        }
    };
    Ok(Ready {
        listener,
        target,
        port,
        context,
        wrote,
    })
}

/// A client of tenant `name`'s API server, reached as `connect` reaches it (a forward through
/// the host API server to a Ready control-plane pod, on a free loopback port), for as long as
/// the returned guard lives. For the commands that look inside the tenant while they wait.
pub async fn tenant_client(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> anyhow::Result<(kube::Client, tokio::sync::oneshot::Sender<()>)> {
    let target = Arc::new(Target::new(client, ns, name));
    let pod = target.resolve().await?;
    target.remember(Some(pod));
    let listener = bind(None).await?;
    let port = listener.local_addr()?.port();
    let stored = kubeconfig_cmd::stored(client, ns, name).await?;
    let text = through_local_port(&stored, port, &default_context_name(ns, name))?;
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&text)
        .with_context(|| format!("reading TenantCluster {name}'s kubeconfig"))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .with_context(|| format!("reading TenantCluster {name}'s kubeconfig"))?;
    let tenant = kube::Client::try_from(config)
        .with_context(|| format!("a client of TenantCluster {name}"))?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(forward::serve(listener, target, async move {
        let _ = stopped.await;
    }));
    Ok((tenant, stop))
}

/// Where the kubeconfig went: a file of its own, or merged into the user's (with the current
/// context it had).
enum Wrote {
    File(String),
    Merged(PathBuf, Option<String>),
}

/// Why there is nothing to connect to yet, with the tenant's phase and Ready condition.
fn not_ready(tc: &TenantCluster, why: anyhow::Error) -> anyhow::Error {
    let (name, ns) = (
        kube::ResourceExt::name_any(tc),
        tc.metadata.namespace.clone().unwrap_or_default(),
    );
    let state = match &tc.status {
        Some(status) => {
            let phase = status.phase.map_or("<none>", |p| p.as_str());
            let ready = conditions::find(&status.conditions, conditions::READY)
                .map(|c| format!(" ({}: {})", c.reason, c.message))
                .unwrap_or_default();
            format!("it is {phase}{ready}")
        }
        None => "the operator has not reported on it yet (is it running?)".to_string(),
    };
    anyhow!(
        "TenantCluster {name} in namespace {ns} has no API server to connect to: {why:#}; {state}; wait until `{} status {name} -n {ns}` says Ready",
        program()
    )
}

async fn bind(port: Option<u16>) -> anyhow::Result<TcpListener> {
    let port = port.unwrap_or(0);
    TcpListener::bind(("127.0.0.1", port)).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => anyhow!(
            "port {port} on 127.0.0.1 is in use: stop what listens there, pick another with --local-port, or leave --local-port out to get a free one"
        ),
        std::io::ErrorKind::PermissionDenied => anyhow!(
            "may not listen on 127.0.0.1:{port} (ports below 1024 need privileges): pick another with --local-port"
        ),
        _ => anyhow!("cannot listen on 127.0.0.1:{port}: {e}"),
    })
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM; the handlers are in place once this returns.
fn stop_signal() -> anyhow::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).context("handling SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

fn shown(path: &Path) -> String {
    std::fs::canonicalize(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

/// After the forward stops: the merged context stays in the file (as vcluster leaves it: run
/// `connect` again to use it); the current context goes back to what it was, unless the user
/// changed it meanwhile.
fn leave_context(file: &Path, context: &str, previous: Option<&str>) -> String {
    let stays = format!(
        "Context {context} stays in {} but answers only while `{} connect` runs",
        file.display(),
        program()
    );
    if previous == Some(context) {
        return format!("{stays}; the current context stays {context}.");
    }
    let restored = kubeconfig_cmd::update_file(file, |existing| {
        Ok(match restore_context(existing, context, previous)? {
            Some(text) => (text, true),
            None => (existing.to_string(), false),
        })
    });
    match (restored, previous) {
        (Ok(true), Some(previous)) => {
            format!("{stays}; the current context is {previous} again.")
        }
        (Ok(true), None) => format!("{stays}; the current context is unset again, as before."),
        (Ok(false), _) => {
            format!("{stays}; the current context was changed meanwhile: left alone.")
        }
        (Err(e), _) => format!(
            "{stays}; could not switch the current context back ({e:#}): run `kubectl config use-context {}`",
            previous.unwrap_or("<context>")
        ),
    }
}

/// The tenant's kubeconfig renamed to `context_name` for a local forward: its server is
/// `https://127.0.0.1:<port>`, and `tls-server-name` the host of the server it named (which the
/// serving certificate carries), so TLS still checks the tenant's certificate.
pub fn through_local_port(text: &str, port: u16, context_name: &str) -> anyhow::Result<String> {
    let mut doc = kubeconfig::from_text(&kubeconfig_cmd::rename(text, context_name)?)?;
    let Some(cluster) = doc.clusters.first_mut().and_then(|c| c.cluster.as_mut()) else {
        bail!("the tenant's kubeconfig has no cluster");
    };
    let server = cluster
        .server
        .as_deref()
        .ok_or_else(|| anyhow!("the tenant's kubeconfig names no server"))?;
    let host = server_host(server)?;
    cluster.server = Some(format!("https://127.0.0.1:{port}"));
    cluster.tls_server_name = Some(host);
    Ok(kubeconfig::to_text(&doc)?)
}

/// `https://dev.team.svc:6443` → `dev.team.svc`; `https://[fd00::1]:6443` → `fd00::1`.
fn server_host(server: &str) -> anyhow::Result<String> {
    let uri: http::Uri = server
        .parse()
        .with_context(|| format!("the tenant's server {server:?} is not a URL"))?;
    let host = uri
        .host()
        .ok_or_else(|| anyhow!("the tenant's server {server:?} names no host"))?;
    Ok(host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string())
}

/// `text` with `current-context: context_name`, and the current context it had.
pub fn switch_context(text: &str, context_name: &str) -> anyhow::Result<(String, Option<String>)> {
    let mut doc = kubeconfig::from_text(text)?;
    let previous = doc.current_context.take().filter(|c| !c.is_empty());
    doc.current_context = Some(context_name.into());
    Ok((kubeconfig::to_text(&doc)?, previous))
}

/// `text` with its current context back to `previous` (unset when `None`), if it is still
/// `context_name`; `None` when someone switched it since, which is then theirs to keep.
pub fn restore_context(
    text: &str,
    context_name: &str,
    previous: Option<&str>,
) -> anyhow::Result<Option<String>> {
    let mut doc = kubeconfig::from_text(text)?;
    if doc.current_context.as_deref() != Some(context_name) {
        return Ok(None);
    }
    doc.current_context = previous.map(String::from);
    Ok(Some(kubeconfig::to_text(&doc)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_yaml::Value;

    /// As the operator stores it: the in-cluster Service address.
    const STORED: &str = "apiVersion: v1
kind: Config
clusters:
- name: dev
  cluster:
    server: https://dev.team-dev.svc:6443
    certificate-authority-data: Q0E=
users:
- name: dev
  user:
    client-certificate-data: Q0VSVA==
    client-key-data: S0VZ
contexts:
- name: dev
  context:
    cluster: dev
    user: dev
current-context: dev
";

    fn doc(text: &str) -> Value {
        serde_yaml::from_str(text).unwrap()
    }

    #[test]
    fn the_server_becomes_the_local_port_and_tls_keeps_the_service_name() {
        let out = doc(&through_local_port(STORED, 40123, "tenantplane-team-dev-dev").unwrap());
        let cluster = &out["clusters"][0];
        assert_eq!(cluster["name"], "tenantplane-team-dev-dev");
        assert_eq!(cluster["cluster"]["server"], "https://127.0.0.1:40123");
        assert_eq!(cluster["cluster"]["tls-server-name"], "dev.team-dev.svc");
        assert_eq!(cluster["cluster"]["certificate-authority-data"], "Q0E=");
        assert_eq!(out["current-context"], "tenantplane-team-dev-dev");
        assert_eq!(out["users"][0]["user"]["client-key-data"], "S0VZ");
        assert_eq!(
            out["contexts"][0]["context"],
            doc("cluster: tenantplane-team-dev-dev\nuser: tenantplane-team-dev-dev")
        );
        assert_eq!(
            default_context_name("team-dev", "dev"),
            "tenantplane-team-dev-dev"
        );
        assert_eq!(server_host("https://[fd00::1]:6443").unwrap(), "fd00::1");
        assert!(through_local_port("clusters: []\n", 1, "x").is_err());
    }

    #[test]
    fn merging_switches_to_the_context_and_stopping_switches_back() {
        let mine = "apiVersion: v1
kind: Config
clusters:
- name: prod
  cluster:
    server: https://prod.example:6443
contexts:
- name: prod
  context:
    cluster: prod
    user: me
current-context: prod
";
        let local = through_local_port(STORED, 40123, "t").unwrap();
        let merged = kubeconfig_cmd::merge(mine, &local, "t").unwrap();
        let (switched, previous) = switch_context(&merged.text, "t").unwrap();
        assert_eq!(previous.as_deref(), Some("prod"));
        let out = doc(&switched);
        assert_eq!(out["current-context"], "t");
        assert_eq!(out["clusters"][0]["name"], "prod", "kept");
        assert_eq!(
            out["clusters"][1]["cluster"]["tls-server-name"],
            "dev.team-dev.svc"
        );

        let back = doc(&restore_context(&switched, "t", Some("prod"))
            .unwrap()
            .unwrap());
        assert_eq!(back["current-context"], "prod");
        assert_eq!(back["contexts"][1]["name"], "t", "the context stays");
        // Switched elsewhere meanwhile: left alone.
        let (elsewhere, _) = switch_context(&switched, "prod").unwrap();
        assert!(restore_context(&elsewhere, "t", None).unwrap().is_none());
        // No current context before: none after.
        let (from_nothing, previous) = switch_context("", "t").unwrap();
        assert_eq!(previous, None);
        let unset = doc(&restore_context(&from_nothing, "t", None).unwrap().unwrap());
        assert!(unset.get("current-context").is_none());
    }
}
