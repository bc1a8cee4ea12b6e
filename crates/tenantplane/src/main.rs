//! The `tenantplane` binary: commands for tenant users (also the kubectl plugin `kubectl tenant`),
//! the operator, and the local dev cluster.

mod connect;
#[cfg(feature = "dev")]
mod dev;
mod format;
mod forward;
mod host;
mod kubeconfig_cmd;
mod manifests;
mod operator;
mod snapshots;
mod tenants;
mod user;
mod version_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use host::HostArgs;
use tenantplane_controller::{BuildOptions, Connector, ControllerOptions};
use user::{UserCommand, run_user};

#[derive(Parser)]
#[command(
    name = "tenantplane",
    version,
    about = "Virtual Kubernetes clusters for teams on a shared host cluster",
    after_help = "Installed as `kubectl-tenant` (a symlink to this binary on PATH), it is the kubectl plugin `kubectl tenant` with the tenant commands."
)]
struct Cli {
    #[command(flatten)]
    host: HostArgs,
    #[command(subcommand)]
    command: Command,
}

/// `kubectl tenant …`: the same binary, invoked as `kubectl-tenant`, with the tenant commands only.
#[derive(Parser)]
#[command(
    name = "kubectl-tenant",
    bin_name = "kubectl tenant",
    version,
    about = "Virtual Kubernetes clusters (TenantClusters) for your team: create, list, inspect, connect, sleep, wake, delete"
)]
struct PluginCli {
    #[command(flatten)]
    host: HostArgs,
    #[command(subcommand)]
    command: UserCommand,
}

#[derive(Clone, Copy, ValueEnum)]
enum ConnectorArg {
    /// The tenant's in-cluster Service address (a real cluster).
    InCluster,
    /// The address the local runtime announces (the local dev cluster).
    Local,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    User(UserCommand),
    /// Print the CustomResourceDefinitions (TenantCluster, IsolationProfile, SyncPolicy,
    /// SnapshotStore, TenantSnapshot) as YAML.
    Crds {
        /// Write one file per CRD into this folder instead of printing them.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Run the operator.
    Controller {
        /// Watch TenantClusters in this namespace only (default: all namespaces).
        #[arg(long)]
        watch_namespace: Option<String>,
        /// Image repository of the tenant control plane; the tag is the k3s release of the tenant's
        /// kubernetesVersion (`<kubernetesVersion>-k3s1`, or a respin's latest build).
        #[arg(long, default_value = tenantplane_controller::names::DEFAULT_K3S_REPOSITORY)]
        k3s_repository: String,
        /// Image repository of the `kubernetes` distribution's kube-apiserver and
        /// kube-controller-manager; the tag is the tenant's kubernetesVersion.
        #[arg(long, default_value = tenantplane_controller::names::DEFAULT_KUBERNETES_REPOSITORY)]
        kubernetes_repository: String,
        /// The `kubernetes` distribution's kine image (its datastore).
        #[arg(long, default_value = tenantplane_controller::names::DEFAULT_KINE_IMAGE)]
        kine_image: String,
        /// The host cluster's service CIDR, as a check: the operator asks the host for its range
        /// (ServiceCIDR objects, else the API server's answer) and reports a tenant
        /// ServiceCIDRMismatch when this disagrees. Default: whatever the host says.
        #[arg(long, value_name = "CIDR")]
        service_cidr: Option<String>,
        /// The namespace the operator runs in; NetworkPolicies let it reach tenant API servers,
        /// and SnapshotStores' credentials Secrets are read from it.
        #[arg(long, env = "POD_NAMESPACE")]
        operator_namespace: Option<String>,
        /// The image of the snapshot agent in every tenant control-plane pod: the operator's
        /// own image, which holds this binary.
        #[arg(long, env = "AGENT_IMAGE", default_value = tenantplane_controller::names::DEFAULT_AGENT_IMAGE)]
        agent_image: String,
        /// How the operator reaches tenant API servers.
        #[arg(long, value_enum, default_value = "in-cluster")]
        connector: ConnectorArg,
        #[command(flatten)]
        operator: Box<operator::OperatorArgs>,
    },
    /// Run the local dev cluster: a real control plane, the operator, the local runtime and the
    /// example tenant, until Ctrl-C.
    /// The snapshot agent, in a tenant's control-plane pod (the operator puts it there): serves
    /// consistent copies of the tenant's datastore to the operator, or, with --restore, waits
    /// for one restore, puts it in place and exits.
    #[command(hide = true)]
    Agent {
        /// Where to listen.
        #[arg(long, default_value = "0.0.0.0:7443")]
        listen: std::net::SocketAddr,
        /// kine's sqlite database.
        #[arg(long)]
        database: PathBuf,
        /// The folder with the tenant's PKI (server CA and key, client CA).
        #[arg(long)]
        pki: PathBuf,
        /// Where copies are made before they are sent.
        #[arg(long)]
        scratch: PathBuf,
        /// Wait for this restore, put it in place, then exit.
        #[arg(long)]
        restore: Option<String>,
    },
    #[cfg(feature = "dev")]
    Dev {
        /// Where the cluster's data, logs and kubeconfig go.
        #[arg(long, default_value = ".tenantplane/dev")]
        state_dir: PathBuf,
        /// What runs the pods: a real node (kubelet, containerd, runc, CNI, kube-proxy) in
        /// namespaces of its own, or kwok's simulated node; `auto` takes a real node where the
        /// machine allows it and says why not otherwise.
        #[arg(long, value_enum, default_value = "auto")]
        nodes: dev::NodesArg,
    },
}

/// Invoked as `kubectl-tenant` (the kubectl plugin)?
fn invoked_as_plugin(argv0: Option<&std::ffi::OsString>) -> bool {
    argv0
        .map(std::path::Path::new)
        .and_then(|p| p.file_stem())
        .is_some_and(|stem| stem == "kubectl-tenant")
}

/// Parse, or print help/version (exit 0) or the usage error (exit 1, as kubectl does).
fn parse_or_exit<P: Parser>(args: Vec<std::ffi::OsString>) -> P {
    P::try_parse_from(args).unwrap_or_else(|e| {
        let _ = e.print();
        std::process::exit(if e.use_stderr() { 1 } else { 0 })
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let result = if invoked_as_plugin(args.first()) {
        host::set_program("kubectl tenant");
        let cli: PluginCli = parse_or_exit(args);
        run_user(&cli.host, cli.command).await
    } else {
        let cli: Cli = parse_or_exit(args);
        run(cli).await
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The one place a command's error meets the person: its whole chain, no debug dump.
            eprintln!("error: {}", tenantplane_controller::error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::User(command) => run_user(&cli.host, command).await?,
        Command::Crds { out: None } => {
            print!(
                "{}",
                tenantplane_api::crds_yaml().context("rendering the CRDs as YAML")?
            );
        }
        Command::Crds { out: Some(dir) } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, yaml) in
                tenantplane_api::crd_files().context("rendering the CRDs as YAML")?
            {
                let path = dir.join(name);
                std::fs::write(&path, yaml)
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("wrote {}", path.display());
            }
        }
        Command::Controller {
            watch_namespace,
            k3s_repository,
            kubernetes_repository,
            kine_image,
            service_cidr,
            operator_namespace,
            agent_image,
            connector,
            operator,
        } => {
            operator::init_logging(&operator)?;
            let connector = match connector {
                ConnectorArg::InCluster => Connector::InCluster,
                ConnectorArg::Local => Connector::Local,
            };
            let options = ControllerOptions {
                build: BuildOptions {
                    k3s_repository,
                    kubernetes_repository,
                    kine_image,
                    service_cidr,
                    operator_namespace: operator_namespace.clone(),
                    local_runtime: connector.is_local(),
                    // Set once the operator has its kubelet endpoint's CA and address.
                    kubelet: None,
                    agent_image: Some(agent_image),
                },
                connector,
                namespace: watch_namespace,
                health_interval: None,
                certificates: operator.certificates()?,
                telemetry: Default::default(),
                wake: operator.wake(),
                snapshots: tenantplane_controller::snapshot::SnapshotOptions {
                    secrets_namespace: operator_namespace.clone(),
                },
                sync_retries: operator.sync_retries()?,
            };
            operator::run(&cli.host, &operator, operator_namespace, options).await?;
        }
        Command::Agent {
            listen,
            database,
            pki,
            scratch,
            restore,
        } => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "info".into()),
                )
                .init();
            tenantplane_controller::snapshot::agent::run(
                tenantplane_controller::snapshot::agent::AgentOptions {
                    listen,
                    database,
                    scratch,
                    pki,
                    restore,
                },
            )
            .await
            .map_err(anyhow::Error::msg)?;
        }
        #[cfg(feature = "dev")]
        Command::Dev { state_dir, nodes } => dev::run(state_dir, nodes).await?,
    }
    Ok(())
}
