//! The `tenantplane` binary: the operator, the local dev cluster, and commands for tenant users.

mod dev;
mod kubeconfig_cmd;
mod manifests;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use tenantplane_controller::{BuildOptions, Connector, ControllerOptions};

#[derive(Parser)]
#[command(
    name = "tenantplane",
    version,
    about = "Virtual Kubernetes clusters for teams on a shared host cluster"
)]
struct Cli {
    /// Kubeconfig of the host cluster (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, global = true, env = "KUBECONFIG", value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
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
    /// Print the CustomResourceDefinitions of TenantCluster, IsolationProfile and SyncPolicy as YAML.
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
        /// Image repository of the tenant control plane; the tag is `<kubernetesVersion>-k3s1`.
        #[arg(long, default_value = tenantplane_controller::names::DEFAULT_K3S_REPOSITORY)]
        k3s_repository: String,
        /// The host cluster's service CIDR (tenants must use the same one).
        #[arg(long, default_value = "10.96.0.0/12")]
        service_cidr: String,
        /// The namespace the operator runs in; NetworkPolicies let it reach tenant API servers.
        #[arg(long, env = "POD_NAMESPACE")]
        operator_namespace: Option<String>,
        /// How the operator reaches tenant API servers.
        #[arg(long, value_enum, default_value = "in-cluster")]
        connector: ConnectorArg,
    },
    /// Run the local dev cluster: a real control plane, the operator, the local runtime and the
    /// example tenant, until Ctrl-C.
    Dev {
        /// Where the cluster's data, logs and kubeconfig go.
        #[arg(long, default_value = ".tenantplane/dev")]
        state_dir: PathBuf,
    },
    /// Print the admin kubeconfig of a TenantCluster.
    Kubeconfig {
        /// The TenantCluster's name.
        name: String,
        /// Its namespace (default: the current context's namespace).
        #[arg(short, long)]
        namespace: Option<String>,
    },
}

async fn host_client(kubeconfig: &Option<PathBuf>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig found: pass --kubeconfig or set KUBECONFIG")?,
    };
    Ok(kube::Client::try_from(config)?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
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
            service_cidr,
            operator_namespace,
            connector,
        } => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "info".into()),
                )
                .init();
            let client = host_client(&cli.kubeconfig).await?;
            let connector = match connector {
                ConnectorArg::InCluster => Connector::InCluster,
                ConnectorArg::Local => Connector::Local,
            };
            let options = ControllerOptions {
                build: BuildOptions {
                    k3s_repository,
                    service_cidr,
                    operator_namespace,
                    local_runtime: connector.is_local(),
                },
                connector,
                namespace: watch_namespace,
                health_interval: None,
            };
            let shutdown = async {
                let _ = tokio::signal::ctrl_c().await;
            };
            tenantplane_controller::run(client, options, shutdown).await;
        }
        Command::Dev { state_dir } => dev::run(state_dir).await?,
        Command::Kubeconfig { name, namespace } => {
            let client = host_client(&cli.kubeconfig).await?;
            let namespace = namespace.unwrap_or_else(|| client.default_namespace().to_string());
            print!("{}", kubeconfig_cmd::run(&client, &namespace, &name).await?);
        }
    }
    Ok(())
}
