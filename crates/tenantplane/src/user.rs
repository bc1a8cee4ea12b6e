//! The tenant user's commands (also the whole of `kubectl tenant`): their arguments, and each
//! handed to the module that carries it out.

use std::path::PathBuf;
use std::time::Duration;

use clap::Subcommand;

use crate::host::{self, HostArgs};
use crate::{connect, format, kubeconfig_cmd, snapshots, tenants};

/// `-n NAMESPACE`, defaulting to the kubeconfig context's namespace.
#[derive(clap::Args, Clone, Debug)]
pub struct NamespaceArg {
    /// The namespace (default: the current context's namespace, else `default`).
    #[arg(short, long, value_name = "NAMESPACE")]
    namespace: Option<String>,
}

/// How long `--wait` waits.
#[derive(clap::Args, Clone, Debug)]
pub struct WaitArgs {
    /// Wait until done, printing progress; exit 1 if it fails or times out.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits, such as 90s, 5m or 1h.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = format::parse_duration)]
    timeout: Duration,
}

impl WaitArgs {
    fn wait(&self) -> Option<Duration> {
        self.wait.then_some(self.timeout)
    }
}

/// The tenant user's commands, also the whole of `kubectl tenant`.
#[derive(Subcommand)]
pub enum UserCommand {
    /// Create a TenantCluster (the example's settings unless flags say otherwise).
    #[command(
        after_help = "With --wait: a line each time the phase or the Ready/Synced reason changes; exit 0 once Ready; exit 1 at once on a failure waiting will not fix (the namespace is another tenant's, a policy is missing, the PKI or the Service range is wrong), deleting the TenantCluster it made unless --keep; exit 1 when it stays Degraded for 20s (with the condition's message) or on --timeout."
    )]
    Create {
        /// The TenantCluster's name.
        name: String,
        #[command(flatten)]
        namespace: NamespaceArg,
        /// The tenant's Kubernetes version [default: v1.30.4].
        #[arg(long, value_name = "vX.Y.Z")]
        version: Option<String>,
        /// The IsolationProfile put around the tenant [default: restricted].
        #[arg(long, value_name = "NAME")]
        isolation_profile: Option<String>,
        /// The SyncPolicy of the tenant [default: default].
        #[arg(long, value_name = "NAME")]
        sync_policy: Option<String>,
        /// What runs the tenant's control plane [default: k3s].
        #[arg(long, value_name = "NAME", value_parser = ["k3s", "kubernetes"])]
        distribution: Option<String>,
        /// Build it from this TenantSnapshot (in the same namespace; its Kubernetes version
        /// unless --version says otherwise).
        #[arg(long, value_name = "SNAPSHOT")]
        from_snapshot: Option<String>,
        /// Create the namespace when it does not exist.
        #[arg(long)]
        create_namespace: bool,
        /// With --wait: keep the TenantCluster when it fails for a reason waiting will not fix
        /// (by default it is deleted, so the same command can be run again once fixed).
        #[arg(long, requires = "wait")]
        keep: bool,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// List TenantClusters.
    #[command(visible_alias = "ls")]
    List {
        #[command(flatten)]
        namespace: NamespaceArg,
        /// Every namespace.
        #[arg(short = 'A', long, conflicts_with = "namespace")]
        all_namespaces: bool,
        /// Output format.
        #[arg(short, long, value_enum)]
        output: Option<tenants::ListOutput>,
    },
    /// Print this client's version, the operator's and, for a named TenantCluster, the version
    /// it asks for and the one its API server reports.
    Version {
        /// A TenantCluster whose versions to show too.
        name: Option<String>,
        #[command(flatten)]
        namespace: NamespaceArg,
    },
    /// Show a TenantCluster's phase, endpoint, admin certificate expiry and conditions.
    Status {
        /// The TenantCluster's name.
        name: String,
        #[command(flatten)]
        namespace: NamespaceArg,
        /// Print the object instead.
        #[arg(short, long, value_enum)]
        output: Option<tenants::ObjectOutput>,
    },
    /// Print the admin kubeconfig of a TenantCluster, or merge it into your kubeconfig.
    Kubeconfig {
        /// The TenantCluster's name.
        name: String,
        #[command(flatten)]
        namespace: NamespaceArg,
        /// Name of the kubeconfig's cluster, user and context (default: the tenant's name).
        #[arg(long, value_name = "NAME", value_parser = clap::builder::NonEmptyStringValueParser::new())]
        context_name: Option<String>,
        /// Merge into your kubeconfig file (the first file of $KUBECONFIG, else ~/.kube/config),
        /// replacing a cluster, user and context of the same name; the current context stays.
        #[arg(long)]
        merge: bool,
    },
    /// Reach a TenantCluster's API server from this machine: a local port forwarded through the
    /// host API server, and a kubeconfig for it; runs until Ctrl-C.
    #[command(
        after_help = "Each connection to 127.0.0.1:PORT is one pods/portforward stream to the tenant's API port (6443) on a Ready control-plane pod, so it works wherever the host API server answers (no NodePort, no Ingress); it needs get on services, list on pods, and get and create on pods/portforward in the namespace (a WebSocket upgrade is a GET; newer API servers also ask for create). The kubeconfig's server is https://127.0.0.1:PORT with tls-server-name set to the tenant's Service name, which its certificate carries.\n\nWithout --kubeconfig-out, the context is merged into your kubeconfig (the first file of $KUBECONFIG, else ~/.kube/config) and made the current context; on Ctrl-C the current context goes back to what it was and the context stays for the next `connect`."
    )]
    Connect {
        /// The TenantCluster's name.
        name: String,
        #[command(flatten)]
        namespace: NamespaceArg,
        /// The local port to listen on (on 127.0.0.1) [default: a free port, printed].
        #[arg(long, value_name = "PORT")]
        local_port: Option<u16>,
        /// Write the kubeconfig to this file (mode 0600) instead of merging it into yours.
        #[arg(long, value_name = "FILE")]
        kubeconfig_out: Option<PathBuf>,
        /// Name of the kubeconfig's cluster, user and context [default: tenantplane-<ns>-<name>].
        #[arg(long, value_name = "NAME", value_parser = clap::builder::NonEmptyStringValueParser::new())]
        context_name: Option<String>,
    },
    /// Put a TenantCluster to sleep: its control plane stops and its pods leave the host; its
    /// objects, volume claims, Services and Secrets stay. Sets spec.sleep.asleep.
    #[command(
        after_help = "With --wait: a line each time the phase or the Ready/Synced reason changes; exit 0 once Sleeping. Wake it with `wake`, `connect`, or any request to its API Service."
    )]
    Sleep {
        /// The TenantCluster's name.
        name: String,
        #[command(flatten)]
        namespace: NamespaceArg,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Wake a sleeping TenantCluster: its control plane starts and its pods come back to the
    /// host. Sets spec.sleep.asleep to false and writes the tenantplane.io/wake annotation.
    #[command(
        after_help = "With --wait: a line each time the phase or the Ready/Synced reason changes; exit 0 once Ready."
    )]
    Wake {
        /// The TenantCluster's name.
        name: String,
        #[command(flatten)]
        namespace: NamespaceArg,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Delete a TenantCluster; its control plane, kubeconfig and isolation objects go with it.
    Delete {
        /// The TenantCluster's name.
        name: String,
        #[command(flatten)]
        namespace: NamespaceArg,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Snapshots of a TenantCluster's datastore in a SnapshotStore: create, list, delete.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Roll a TenantCluster back to a snapshot, in place: its control plane stops, the data is
    /// replaced, it starts again and the host follows. Sets spec.restore.
    #[command(
        after_help = "The snapshot is checked (checksum, version) before anything is touched. With --wait: a line at each step; exit 0 once restored and Ready, 1 if the restore fails or is refused (with the reason) or on --timeout."
    )]
    Restore {
        /// The TenantCluster's name.
        name: String,
        #[command(flatten)]
        namespace: NamespaceArg,
        /// The TenantSnapshot to restore.
        #[arg(long, value_name = "NAME")]
        snapshot: String,
        /// The snapshot's namespace, when it is not the tenant's (the snapshot must grant it with
        /// the tenantplane.io/restore-to annotation).
        #[arg(long, value_name = "NAMESPACE")]
        snapshot_namespace: Option<String>,
        /// Go ahead: what was created or changed since the snapshot is lost.
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Undo a TenantCluster's last minor upgrade: restore the snapshot taken before it, at the
    /// version it ran.
    #[command(
        after_help = "With --wait: a line at each step; exit 0 once restored and Ready, 1 if it fails or on --timeout."
    )]
    Rollback {
        /// The TenantCluster's name.
        name: String,
        #[command(flatten)]
        namespace: NamespaceArg,
        /// Go ahead: what was created or changed since the upgrade is lost.
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        wait: WaitArgs,
    },
}

#[derive(Subcommand)]
pub enum SnapshotCommand {
    /// Take a consistent snapshot of a TenantCluster while it runs.
    #[command(
        after_help = "With --wait: a line at each change and every 10s; exit 0 once Completed, 1 if it Failed (with the reason) or on --timeout."
    )]
    Create {
        /// The TenantCluster's name.
        tenant: String,
        #[command(flatten)]
        namespace: NamespaceArg,
        /// The snapshot's name [default: <tenant>-<yyyymmdd-hhmmss>].
        #[arg(long)]
        name: Option<String>,
        /// The SnapshotStore [default: the store marked default].
        #[arg(long, value_name = "NAME")]
        store: Option<String>,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// List snapshots, of one TenantCluster if named.
    #[command(visible_alias = "ls")]
    List {
        /// Only this TenantCluster's snapshots.
        tenant: Option<String>,
        #[command(flatten)]
        namespace: NamespaceArg,
        /// Every namespace.
        #[arg(short = 'A', long, conflicts_with = "namespace")]
        all_namespaces: bool,
    },
    /// Delete a snapshot and its stored copy.
    Delete {
        /// The snapshot's name.
        name: String,
        #[command(flatten)]
        namespace: NamespaceArg,
        #[command(flatten)]
        wait: WaitArgs,
    },
}

/// Run one user command against the host.
///
/// Over 100 lines as a dispatch table: one short arm per subcommand, each handing its arguments to
/// the module that does the work; splitting it would only move the `match`.
pub async fn run_user(host: &HostArgs, command: UserCommand) -> anyhow::Result<()> {
    let client = host::client(host).await?;
    let ns = |arg: NamespaceArg| tenants::namespace_or_default(&client, arg.namespace);
    match command {
        UserCommand::Create {
            name,
            namespace,
            version,
            isolation_profile,
            sync_policy,
            distribution,
            from_snapshot,
            create_namespace,
            keep,
            wait,
        } => {
            let options = tenants::CreateOptions {
                name,
                version,
                isolation_profile,
                sync_policy,
                distribution,
                from_snapshot,
                create_namespace,
                keep,
            };
            tenants::create(&client, &ns(namespace), &options, wait.wait()).await
        }
        UserCommand::List {
            namespace,
            all_namespaces,
            output,
        } => {
            let namespace = (!all_namespaces).then(|| ns(namespace));
            tenants::list(&client, namespace.as_deref(), output).await
        }
        UserCommand::Version { name, namespace } => {
            let namespace = ns(namespace);
            let tenant = name.as_deref().map(|n| (namespace.as_str(), n));
            crate::version_cmd::run(&client, tenant).await
        }
        UserCommand::Status {
            name,
            namespace,
            output,
        } => tenants::status(&client, &ns(namespace), &name, output).await,
        UserCommand::Kubeconfig {
            name,
            namespace,
            context_name,
            merge,
        } => {
            let namespace = ns(namespace);
            let text = kubeconfig_cmd::run(&client, &namespace, &name).await?;
            if merge {
                let context_name = context_name.unwrap_or_else(|| name.clone());
                let target = kubeconfig_cmd::merge_target()?;
                let merged = kubeconfig_cmd::merge_into_file(&target, &text, &context_name)?;
                println!(
                    "Merged TenantCluster {name} (namespace {namespace}) into {}: {}",
                    target.display(),
                    kubeconfig_cmd::describe_changes(&merged, &context_name)
                );
                println!(
                    "Use it with `kubectl --context {context_name} get namespaces`, or make it the current context with `kubectl config use-context {context_name}`"
                );
            } else {
                match context_name {
                    Some(context_name) => {
                        print!("{}", kubeconfig_cmd::rename(&text, &context_name)?);
                    }
                    None => print!("{text}"),
                }
            }
            Ok(())
        }
        UserCommand::Connect {
            name,
            namespace,
            local_port,
            kubeconfig_out,
            context_name,
        } => {
            let options = connect::ConnectOptions {
                namespace: ns(namespace),
                name,
                local_port,
                kubeconfig_out,
                context_name,
            };
            connect::run(&client, &options).await
        }
        UserCommand::Sleep {
            name,
            namespace,
            wait,
        } => tenants::sleep(&client, &ns(namespace), &name, wait.wait()).await,
        UserCommand::Wake {
            name,
            namespace,
            wait,
        } => tenants::wake(&client, &ns(namespace), &name, wait.wait()).await,
        UserCommand::Delete {
            name,
            namespace,
            wait,
        } => tenants::delete(&client, &ns(namespace), &name, wait.wait()).await,
        UserCommand::Snapshot(SnapshotCommand::Create {
            tenant,
            namespace,
            name,
            store,
            wait,
        }) => {
            let options = snapshots::CreateOptions {
                namespace: ns(namespace),
                tenant,
                name,
                store,
                wait: wait.wait(),
            };
            snapshots::create(&client, options).await
        }
        UserCommand::Snapshot(SnapshotCommand::List {
            tenant,
            namespace,
            all_namespaces,
        }) => {
            let namespace = (!all_namespaces).then(|| ns(namespace));
            snapshots::list(&client, namespace.as_deref(), tenant.as_deref()).await
        }
        UserCommand::Snapshot(SnapshotCommand::Delete {
            name,
            namespace,
            wait,
        }) => snapshots::delete(&client, &ns(namespace), &name, wait.wait()).await,
        UserCommand::Restore {
            name,
            namespace,
            snapshot,
            snapshot_namespace,
            yes,
            wait,
        } => {
            let options = tenants::RestoreOptions {
                namespace: ns(namespace),
                name,
                snapshot,
                snapshot_namespace,
                yes,
                wait: wait.wait(),
            };
            tenants::restore(&client, options).await
        }
        UserCommand::Rollback {
            name,
            namespace,
            yes,
            wait,
        } => tenants::rollback(&client, &ns(namespace), &name, yes, wait.wait()).await,
    }
}
