//! The host cluster, found as kubectl finds it: `--kubeconfig`, else every file of `KUBECONFIG`
//! that exists (merged, the first one winning), else `~/.kube/config`, else the in-cluster
//! service account; `--context` picks a context. Also: the errors the API server sends, turned
//! into sentences that say what to do.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, anyhow, bail};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// How the host cluster is reached; global flags of every command.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct HostArgs {
    /// The host cluster's kubeconfig (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
}

static PROGRAM: OnceLock<&'static str> = OnceLock::new();

/// Set once at start: `tenantplane`, or `kubectl tenant` when run as the kubectl plugin.
pub fn set_program(name: &'static str) {
    let _ = PROGRAM.set(name);
}

/// How the user invoked us, for the commands that hints suggest.
pub fn program() -> &'static str {
    PROGRAM.get().copied().unwrap_or("tenantplane")
}

/// `~/.kube/config`.
pub fn default_kubeconfig_path() -> Option<PathBuf> {
    std::env::home_dir().map(|home| home.join(".kube").join("config"))
}

/// The files `KUBECONFIG` names, in order (empty entries skipped).
pub fn kubeconfig_env_paths() -> Vec<PathBuf> {
    std::env::var_os("KUBECONFIG")
        .map(|value| {
            std::env::split_paths(&value)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default()
}

fn read(path: &Path) -> anyhow::Result<Kubeconfig> {
    Kubeconfig::read_from(path).with_context(|| format!("reading kubeconfig {}", path.display()))
}

/// The kubeconfig to use, or `None` when there is none (then in-cluster).
fn load_kubeconfig(args: &HostArgs) -> anyhow::Result<Option<Kubeconfig>> {
    if let Some(path) = &args.kubeconfig {
        return read(path).map(Some);
    }
    let env_paths = kubeconfig_env_paths();
    if !env_paths.is_empty() {
        // As kubectl does: files that do not exist are skipped, the first one to set a field wins.
        let mut merged: Option<Kubeconfig> = None;
        for path in env_paths.iter().filter(|p| p.exists()) {
            let next = read(path)?;
            merged = Some(match merged {
                None => next,
                Some(m) => m
                    .merge(next)
                    .with_context(|| format!("merging kubeconfig {}", path.display()))?,
            });
        }
        return Ok(merged);
    }
    match default_kubeconfig_path() {
        Some(path) if path.exists() => read(&path).map(Some),
        _ => Ok(None),
    }
}

/// A client for the host cluster. Its default namespace is the context's, else `default` (in a
/// pod: the pod's).
pub async fn client(args: &HostArgs) -> anyhow::Result<kube::Client> {
    kube::Client::try_from(config(args).await?).context("building a client for the host cluster")
}

/// A client that names itself `user_agent` to the API server (its audit log records that).
pub async fn client_with_agent(args: &HostArgs, user_agent: &str) -> anyhow::Result<kube::Client> {
    kube::Client::try_from(config_with_agent(args, user_agent).await?)
        .context("building a client for the host cluster")
}

/// The host client configuration, with `user_agent` as its User-Agent.
pub async fn config_with_agent(args: &HostArgs, user_agent: &str) -> anyhow::Result<kube::Config> {
    let mut config = config(args).await?;
    let value = http::HeaderValue::from_str(user_agent)
        .with_context(|| format!("{user_agent:?} cannot be a User-Agent header"))?;
    config.headers.push((http::header::USER_AGENT, value));
    Ok(config)
}

async fn config(args: &HostArgs) -> anyhow::Result<kube::Config> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let config = match load_kubeconfig(args)? {
        Some(kubeconfig) => kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|e| match &args.context {
                Some(context) => anyhow!("cannot use kubeconfig context {context:?}: {e}"),
                None => anyhow!("cannot use the kubeconfig: {e}"),
            })?,
        None => {
            if let Some(context) = &args.context {
                bail!(
                    "--context {context} given, but no kubeconfig found: set KUBECONFIG or pass --kubeconfig"
                );
            }
            kube::Config::incluster().map_err(|_| {
                anyhow!(
                    "no kubeconfig found and not running in a cluster: set KUBECONFIG, pass --kubeconfig FILE, or create ~/.kube/config"
                )
            })?
        }
    };
    Ok(config)
}

/// What went wrong talking to the host API server, as a sentence. `what` names the object, such
/// as `TenantCluster dev in namespace team-dev`.
pub fn explain(error: kube::Error, what: &str) -> anyhow::Error {
    match error {
        kube::Error::Api(status) => {
            let message = status.message.trim().to_string();
            match status.code {
                401 => anyhow!(
                    "the host API server did not accept your credentials ({message}); log in again or check your kubeconfig"
                ),
                403 => anyhow!(
                    "the host API server refused access to {what}: {message}; ask your cluster admin for RBAC rights on tenantclusters.tenantplane.io"
                ),
                404 if status.details.as_ref().is_none_or(|d| d.name.is_empty())
                    && message.contains("could not find the requested resource") =>
                {
                    anyhow!(
                        "the host cluster does not serve TenantClusters (tenantplane.io/v1alpha1): is TenantPlane installed? (`tenantplane crds | kubectl apply -f -`)"
                    )
                }
                _ => anyhow!("the host API server refused {what}: {message}"),
            }
        }
        other => anyhow!(
            "cannot reach the host API server: {other}; check KUBECONFIG, --kubeconfig or --context"
        ),
    }
}

/// Is this the API server's "not found"?
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

/// `TenantCluster NAME not found in namespace NS`, with what to do about it.
pub fn tenant_not_found(name: &str, namespace: &str) -> anyhow::Error {
    anyhow!(
        "TenantCluster {name} not found in namespace {namespace}; list the tenants with `{} list -n {namespace}` (or `-A` for every namespace)",
        program()
    )
}
