//! Reaching a tenant run by the local runtime, as the operator does: for tests, benchmarks and
//! `tenantplane dev`.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Client;
use kube::api::Api;
use tenantplane_controller::kubelet::{self, KubeletOptions};
use tenantplane_controller::{BuildOptions, Connector, ControllerOptions, api_message, names};
use tenantplane_testenv::host_cluster::real_node;

use crate::{Error, Result};

/// The operator's options for the local runtime on the test control plane: the local connector,
/// control-plane pods labelled for the runtime; the service range is asked of the host.
pub fn local_operator_options(
    namespace: Option<String>,
    health_interval: Option<Duration>,
    kubelet: Option<KubeletOptions>,
) -> ControllerOptions {
    ControllerOptions {
        build: BuildOptions {
            local_runtime: true,
            kubelet,
            ..Default::default()
        },
        connector: Connector::Local,
        namespace,
        health_interval,
        ..Default::default()
    }
}

/// Serve the operator's kubelet endpoint on a free loopback port, as the operator would: its CA
/// from Secret `tenantplane-kubelet-ca` in `ca_namespace` (made when missing). `config` is the
/// operator's host configuration; the endpoint's client never times out idle streams.
pub async fn start_kubelet(
    mut config: kube::Config,
    ca_namespace: &str,
    scope: Option<String>,
) -> Result<KubeletOptions> {
    config.read_timeout = None;
    let host = Client::try_from(config).map_err(|e| {
        Error::Testenv(tenantplane_testenv::Error::Client(format!(
            "a host client: {}",
            api_message(&e)
        )))
    })?;
    let ca = kubelet::load_or_create_ca(&host, ca_namespace).await?;
    let port = tenantplane_testenv::process::free_port()?;
    // With a real node, at the node's address, which its pods reach (a `kubernetes` tenant's
    // API server runs in one); else on loopback, where the local runtime's API servers are.
    let address: std::net::IpAddr = if real_node::running() {
        real_node::NODE_IP
            .parse()
            .map_err(|e| tenantplane_testenv::Error::Io(format!("the real node's address: {e}")))?
    } else {
        [127, 0, 0, 1].into()
    };
    let settings = kubelet::Settings {
        listen: (address, port).into(),
        endpoint: kubelet::KubeletEndpoint {
            address: address.to_string(),
            port,
        },
        dns_names: vec!["localhost".into()],
        ca,
        scope,
    };
    let options = settings.options();
    let serve = kubelet::bind(host, settings).await?;
    tokio::spawn(serve);
    Ok(options)
}

/// A client for tenant `name` in host namespace `ns`: its kubeconfig Secret, dialled where the
/// local runtime says the tenant API server answers.
pub async fn tenant_client(host: &Client, ns: &str, name: &str) -> Result<Client> {
    let secret_name = names::kubeconfig_secret(name);
    let secret = Api::<Secret>::namespaced(host.clone(), ns)
        .get(&secret_name)
        .await
        .map_err(|error| Error::Read {
            what: format!("Secret {ns}/{secret_name}"),
            error,
        })?;
    let kubeconfig = secret
        .data
        .as_ref()
        .and_then(|d| d.get(names::KUBECONFIG_KEY))
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        .ok_or_else(|| Error::NoKubeconfig {
            secret: format!("{ns}/{secret_name}"),
            key: names::KUBECONFIG_KEY,
        })?;
    let pod_name = names::control_plane_pod(name);
    let pod = Api::<Pod>::namespaced(host.clone(), ns)
        .get(&pod_name)
        .await
        .map_err(|error| Error::Read {
            what: format!("pod {ns}/{pod_name}"),
            error,
        })?;
    let server = Connector::Local.server(name, ns, &pod)?;
    Ok(Connector::Local
        .client(&kubeconfig, name, ns, &server)
        .await?)
}
