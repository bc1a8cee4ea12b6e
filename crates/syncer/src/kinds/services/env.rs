//! The variables a pod gets for Services, computed for the tenant's (whose cluster IPs are their
//! host copies'), since copies never get the host's own (`enableServiceLinks` is off on them).

use k8s_openapi::api::core::v1::{EnvVar, Service};
use kube::ResourceExt;

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

/// The Docker-links variables the kubelet gives for a Service, computed for the tenant's Service
/// (whose cluster IP is its host copy's).
pub fn service_env(svc: &Service) -> Vec<EnvVar> {
    let Some(spec) = svc.spec.as_ref() else {
        return vec![];
    };
    let Some(ip) = spec.cluster_ip.as_deref().filter(|ip| *ip != "None") else {
        return vec![];
    };
    let Some(first) = spec.ports.as_ref().and_then(|p| p.first()) else {
        return vec![];
    };
    let prefix = svc.name_any().to_uppercase().replace('-', "_");
    let proto = super::protocol;
    let mut out = vec![
        env(&format!("{prefix}_SERVICE_HOST"), ip),
        env(&format!("{prefix}_SERVICE_PORT"), &first.port.to_string()),
        env(
            &format!("{prefix}_PORT"),
            &format!("{}://{ip}:{}", proto(first).to_lowercase(), first.port),
        ),
    ];
    for p in spec.ports.iter().flatten() {
        if let Some(name) = &p.name {
            out.push(env(
                &format!(
                    "{prefix}_SERVICE_PORT_{}",
                    name.to_uppercase().replace('-', "_")
                ),
                &p.port.to_string(),
            ));
        }
        let base = format!("{prefix}_PORT_{}_{}", p.port, proto(p).to_uppercase());
        out.push(env(
            &base,
            &format!("{}://{ip}:{}", proto(p).to_lowercase(), p.port),
        ));
        out.push(env(&format!("{base}_PROTO"), &proto(p).to_lowercase()));
        out.push(env(&format!("{base}_PORT"), &p.port.to_string()));
        out.push(env(&format!("{base}_ADDR"), ip));
    }
    out
}

/// The variables that reach the tenant API server from a pod, at `ip` on 443.
pub fn tenant_api_env(ip: &str) -> Vec<EnvVar> {
    let address = format!("tcp://{ip}:443");
    vec![
        env("KUBERNETES_SERVICE_HOST", ip),
        env("KUBERNETES_SERVICE_PORT", "443"),
        env("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
        env("KUBERNETES_PORT", &address),
        env("KUBERNETES_PORT_443_TCP", &address),
        env("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
        env("KUBERNETES_PORT_443_TCP_PORT", "443"),
        env("KUBERNETES_PORT_443_TCP_ADDR", ip),
    ]
}
