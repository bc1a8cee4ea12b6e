//! `tenantplane controller`: how the operator process runs: logs, the metrics endpoint, SIGTERM,
//! and leader election among replicas.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::ValueEnum;
use tenantplane_controller::leader::{self, LeaseSettings};
use tenantplane_controller::{CertificateOptions, ControllerOptions, kubelet, telemetry};
use tracing::info;

use crate::format;
use crate::host::{self, HostArgs};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, with the reconcile's tenant in `span`.
    Json,
}

/// The operator process's flags.
#[derive(clap::Args, Clone, Debug)]
pub struct OperatorArgs {
    /// Log format.
    #[arg(
        long,
        value_enum,
        env = "TENANTPLANE_LOG_FORMAT",
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// Log level, or a filter such as `info,tenantplane_controller=debug`.
    #[arg(long, env = "TENANTPLANE_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(long, default_value = "0.0.0.0:8080", value_name = "ADDRESS:PORT")]
    pub metrics_address: SocketAddr,
    /// Run only while holding the leader Lease, so that several replicas can run.
    #[arg(long)]
    pub leader_elect: bool,
    /// The Lease's name.
    #[arg(long, default_value = "tenantplane")]
    pub lease_name: String,
    /// The Lease's namespace (default: the operator's namespace).
    #[arg(long, value_name = "NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// This replica's identity in the Lease (default: the pod name, else host name and process id).
    #[arg(long, env = "POD_NAME", value_name = "NAME")]
    pub leader_elect_identity: Option<String>,
    /// How long a standby waits on a Lease that is not renewed before taking it over.
    #[arg(long, default_value = "15s", value_parser = format::parse_duration)]
    pub lease_duration: Duration,
    /// How long the leader keeps leading while its renewals fail.
    #[arg(long, default_value = "10s", value_parser = format::parse_duration)]
    pub lease_renew_deadline: Duration,
    /// How often the leader renews the Lease and a standby looks at it.
    #[arg(long, default_value = "2s", value_parser = format::parse_duration)]
    pub lease_retry_period: Duration,
    /// Lifetime of the admin certificates the operator issues (the CAs last 10 years).
    #[arg(long, default_value = "365d", value_parser = format::parse_duration)]
    pub certificate_validity: Duration,
    /// Renew an admin certificate (and rewrite the kubeconfig Secret) when less than this is left.
    #[arg(long, default_value = "30d", value_parser = format::parse_duration)]
    pub renew_certificates_before: Duration,
    /// How long a tenant's syncer waits before it tries again an object the host or the
    /// IsolationProfile refused; each failure in a row doubles the wait.
    #[arg(long, default_value = "10s", value_parser = format::parse_duration)]
    pub sync_retry_refused_after: Duration,
    /// The longest wait between a syncer's tries of an object that keeps failing.
    #[arg(long, default_value = "5m", value_parser = format::parse_duration)]
    pub sync_retry_max: Duration,
    /// Where the kubelet endpoint of the virtual nodes listens (tenant API servers call it for
    /// logs, exec, attach and port-forward).
    #[arg(long, default_value = "0.0.0.0:10250", value_name = "ADDRESS:PORT")]
    pub kubelet_listen: SocketAddr,
    /// The IP address virtual nodes give for their kubelet (default: the cluster IP of the
    /// `--kubelet-service` Service in the operator's namespace).
    #[arg(long, value_name = "IP")]
    pub kubelet_address: Option<std::net::IpAddr>,
    /// The port virtual nodes give for their kubelet: the Service's port.
    #[arg(long, default_value_t = tenantplane_controller::kubelet::DEFAULT_PORT)]
    pub kubelet_port: u16,
    /// The Service in front of the kubelet endpoint, in the operator's namespace.
    #[arg(long, default_value = "tenantplane-kubelet", value_name = "NAME")]
    pub kubelet_service: String,
    /// The operator's address that a sleeping tenant's API Service leads to: a request there
    /// wakes the tenant and passes through once it is Ready. Without it, only `connect` and
    /// `wake` wake a tenant.
    #[arg(long, env = "POD_IP", value_name = "IP")]
    pub wake_address: Option<std::net::IpAddr>,
    /// The ports the wake doors take, one per sleeping tenant (on every address).
    #[arg(long, default_value = "7400-7999", value_name = "FIRST-LAST", value_parser = parse_port_range)]
    pub wake_ports: std::ops::RangeInclusive<u16>,
}

/// A `--wake-ports` value that is not `FIRST-LAST`.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid port range {0:?}: use FIRST-LAST, such as 7400-7999")]
pub struct BadPortRange(String);

/// `FIRST-LAST`, such as `7400-7999`.
fn parse_port_range(text: &str) -> Result<std::ops::RangeInclusive<u16>, BadPortRange> {
    let bad = || BadPortRange(text.to_string());
    let (first, last) = text.split_once('-').ok_or_else(bad)?;
    let first: u16 = first.trim().parse().map_err(|_| bad())?;
    let last: u16 = last.trim().parse().map_err(|_| bad())?;
    if first == 0 || first > last {
        return Err(bad());
    }
    Ok(first..=last)
}

impl OperatorArgs {
    /// Where the wake doors listen, if the operator knows its address.
    pub fn wake(&self) -> Option<tenantplane_controller::wake::WakeOptions> {
        let advertise = self.wake_address?;
        let listen = match advertise {
            std::net::IpAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
            std::net::IpAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
        };
        Some(tenantplane_controller::wake::WakeOptions {
            listen,
            advertise,
            ports: self.wake_ports.clone(),
        })
    }

    /// How tenants' syncers retry: the first wait after a refusal is at most the longest.
    pub fn sync_retries(&self) -> anyhow::Result<tenantplane_syncer::Retries> {
        anyhow::ensure!(
            self.sync_retry_refused_after <= self.sync_retry_max,
            "--sync-retry-refused-after ({:?}) must not be longer than --sync-retry-max ({:?})",
            self.sync_retry_refused_after,
            self.sync_retry_max
        );
        Ok(tenantplane_syncer::Retries {
            refused_first: self.sync_retry_refused_after,
            max: self.sync_retry_max,
        })
    }

    pub fn certificates(&self) -> anyhow::Result<CertificateOptions> {
        let options = CertificateOptions {
            validity: self.certificate_validity,
            renew_before: self.renew_certificates_before,
        };
        options.validate()?;
        Ok(options)
    }

    fn lease(&self, operator_namespace: Option<String>) -> anyhow::Result<LeaseSettings> {
        let namespace = self.lease_namespace.clone().or(operator_namespace).context(
            "--leader-elect needs the Lease's namespace: set --lease-namespace, --operator-namespace or POD_NAMESPACE",
        )?;
        let identity = self.leader_elect_identity.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "tenantplane".into());
            format!("{host}-{}", std::process::id())
        });
        let settings = LeaseSettings {
            namespace,
            name: self.lease_name.clone(),
            identity,
            duration: self.lease_duration,
            renew_deadline: self.lease_renew_deadline,
            retry_period: self.lease_retry_period,
        };
        settings.validate()?;
        Ok(settings)
    }
}

/// Logs to stdout in the chosen format, at the chosen level.
pub fn init_logging(args: &OperatorArgs) -> anyhow::Result<()> {
    // kube-client's own ERROR line for each failed request (`failed with error client error
    // (Connect)`) names no tenant; the operator reports those failures itself, with the tenant.
    // Off unless the filter names kube-client's target (see `telemetry::log_filter`).
    let directives = telemetry::log_filter(&args.log_level);
    let filter = tracing_subscriber::EnvFilter::try_new(&directives).with_context(|| {
        format!(
            "--log-level {:?} is not a level (error, warn, info, debug, trace) or a filter such as info,tenantplane_controller=debug",
            args.log_level
        )
    })?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match args.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
    Ok(())
}

/// Resolves on SIGTERM (what Kubernetes sends) or Ctrl-C.
async fn terminated() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => info!("SIGTERM: finishing in-flight work, then stopping"),
                    _ = tokio::signal::ctrl_c() => info!("interrupted: finishing in-flight work, then stopping"),
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The kubelet endpoint's settings: its CA from the operator's namespace (made once), and the
/// address virtual nodes give (the flag, else the cluster IP of its Service).
async fn kubelet_settings(
    client: &kube::Client,
    args: &OperatorArgs,
    operator_namespace: Option<&str>,
    scope: Option<String>,
) -> anyhow::Result<kubelet::Settings> {
    let namespace = operator_namespace.context(
        "the kubelet endpoint keeps its CA in the operator's namespace: set --operator-namespace or POD_NAMESPACE",
    )?;
    let ca = kubelet::load_or_create_ca(client, namespace).await?;
    let address = match args.kubelet_address {
        Some(ip) => ip.to_string(),
        None => {
            let name = &args.kubelet_service;
            let service = kube::Api::<k8s_openapi::api::core::v1::Service>::namespaced(
                client.clone(),
                namespace,
            )
            .get(name)
            .await
            .with_context(|| {
                format!(
                    "reading Service {namespace}/{name}, whose cluster IP virtual nodes give for their kubelet: create it (the chart does) or pass --kubelet-address"
                )
            })?;
            service
                .spec
                .and_then(|s| s.cluster_ip)
                .filter(|ip| !ip.is_empty() && ip != "None")
                .with_context(|| {
                    format!("Service {namespace}/{name} has no cluster IP: give it one, or pass --kubelet-address")
                })?
        }
    };
    Ok(kubelet::Settings {
        listen: args.kubelet_listen,
        endpoint: kubelet::KubeletEndpoint {
            address,
            port: args.kubelet_port,
        },
        dns_names: vec![
            format!("{}.{namespace}.svc", args.kubelet_service),
            format!("{}.{namespace}.svc.cluster.local", args.kubelet_service),
        ],
        ca,
        scope,
    })
}

/// Serve the metrics endpoint and the kubelet endpoint, and run the controller (under leader
/// election when asked) until SIGTERM; an error when leadership is lost.
pub async fn run(
    host: &HostArgs,
    args: &OperatorArgs,
    operator_namespace: Option<String>,
    mut options: ControllerOptions,
) -> anyhow::Result<()> {
    let lease = args
        .leader_elect
        .then(|| args.lease(operator_namespace.clone()))
        .transpose()?;
    // The user agent names the replica, so the API server's audit log tells replicas apart.
    let identity = lease.as_ref().map_or("controller", |l| l.identity.as_str());
    let agent = format!("tenantplane/{} ({identity})", env!("CARGO_PKG_VERSION"));
    let client = host::client_with_agent(host, &agent).await?;
    let telemetry = options.telemetry.clone();
    let endpoint = telemetry::bind(args.metrics_address, telemetry.clone())
        .await
        .with_context(|| {
            format!(
                "serving metrics on {}: choose another --metrics-address",
                args.metrics_address
            )
        })?;
    tokio::spawn(endpoint);
    // Every replica serves the kubelet endpoint, so a standby answers too.
    let settings = kubelet_settings(
        &client,
        args,
        operator_namespace.as_deref(),
        options.namespace.clone(),
    )
    .await?;
    options.build.kubelet = Some(settings.options());
    let (listen, mut streams) = (
        settings.listen,
        host::config_with_agent(host, &agent).await?,
    );
    // Streams stay open as long as their user keeps them: no idle read timeout.
    streams.read_timeout = None;
    let streams =
        kube::Client::try_from(streams).context("building the kubelet endpoint's client")?;
    let kubelet = kubelet::bind(streams, settings)
        .await
        .with_context(|| format!("choose another --kubelet-listen than {listen}"))?;
    tokio::spawn(kubelet);
    match lease {
        Some(lease) => {
            info!(identity = %lease.identity, lease = %lease.name, namespace = %lease.namespace, "leader election: waiting for the Lease");
            leader::run_elected(client, options, lease, terminated())
                .await
                .map_err(anyhow::Error::msg)?;
        }
        None => {
            telemetry.readiness.set_role(telemetry::Role::Leader);
            telemetry.metrics.set_leader(true);
            tenantplane_controller::run(client, options, terminated()).await;
        }
    }
    info!("stopped");
    Ok(())
}
