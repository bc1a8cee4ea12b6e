//! Node ports: a tenant Service's are its host copy's. The copy asks the host for the ones the
//! tenant Service has; where the host holds one already, the copy takes the host's choice and
//! the tenant Service shows it.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};

/// The key a Service port is known by on both sides.
fn port_key(p: &ServicePort) -> (i32, String) {
    (p.port, super::protocol(p))
}

/// Does Service spec `s` take node ports (NodePort, or LoadBalancer unless it turns them off)?
fn takes_node_ports(s: &ServiceSpec) -> bool {
    match s.type_.as_deref() {
        Some("NodePort") => true,
        Some("LoadBalancer") => s.allocate_load_balancer_node_ports != Some(false),
        _ => false,
    }
}

/// Host copy `copy` asking, for each port, for the node port tenant Service `t` has, so a node
/// port the tenant shows is the one the host answers on. Only for the types that take node
/// ports. (Where the host refuses one, the copy keeps or gets one of the host's choosing, and
/// the tenant Service takes that: [`node_ports_up`].)
pub fn with_node_ports(mut copy: Service, t: &Service) -> Service {
    if let Some(spec) = copy.spec.as_mut().filter(|s| takes_node_ports(s)) {
        for p in spec.ports.iter_mut().flatten() {
            p.node_port = node_port(Some(t), &port_key(p));
        }
    }
    copy
}

/// The node port Service `s` gives its port `key`, if its type takes node ports.
fn node_port(s: Option<&Service>, key: &(i32, String)) -> Option<i32> {
    s.and_then(|s| s.spec.as_ref())
        .filter(|s| takes_node_ports(s))
        .and_then(|s| s.ports.as_ref())
        .and_then(|ports| ports.iter().find(|p| &port_key(p) == key))
        .and_then(|p| p.node_port)
}

/// Tenant Service `t`'s ports with the node ports of its copy `h`, where one differs; `None`
/// when they agree.
pub fn node_ports_up(t: &Service, h: &Service) -> Option<Vec<ServicePort>> {
    let spec = t.spec.as_ref().filter(|s| takes_node_ports(s))?;
    let mut ports = spec.ports.clone()?;
    let mut changed = false;
    for p in &mut ports {
        let theirs = node_port(Some(h), &port_key(p));
        if theirs.is_some() && theirs != p.node_port {
            p.node_port = theirs;
            changed = true;
        }
    }
    changed.then_some(ports)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::tests::{host_name_of, translator};
    use serde_json::json;

    /// The host copy of `svc`, named as its converge names it.
    fn copy_of(svc: &Service) -> Service {
        let tr = translator();
        super::super::service(&tr, svc, &host_name_of(&tr, &svc.metadata))
    }

    #[test]
    fn a_copy_asks_for_the_tenants_node_ports_and_the_tenant_shows_the_hosts() {
        let svc = |type_: &str, ports: serde_json::Value| -> Service {
            serde_json::from_value(json!({
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"type": type_, "ports": ports}
            }))
            .unwrap()
        };
        let t = svc(
            "NodePort",
            json!([{"name": "http", "port": 80, "nodePort": 30080},
                   {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}]),
        );
        let node_ports = |s: &Service| -> Vec<Option<i32>> {
            s.spec
                .as_ref()
                .unwrap()
                .ports
                .iter()
                .flatten()
                .map(|p| p.node_port)
                .collect()
        };
        assert_eq!(
            node_ports(&copy_of(&t)),
            [None, None],
            "the translation is pure"
        );
        let asked = with_node_ports(copy_of(&t), &t);
        assert_eq!(node_ports(&asked), [Some(30080), Some(30053)]);
        // A ClusterIP Service takes none, whatever its tenant side had a moment ago.
        let plain = svc("ClusterIP", json!([{"port": 80}]));
        assert_eq!(node_ports(&with_node_ports(copy_of(&plain), &t)), [None]);

        // The host chose another for one port: the tenant Service shows it.
        let h = svc(
            "NodePort",
            json!([{"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053},
                   {"name": "http", "port": 80, "protocol": "TCP", "nodePort": 31999}]),
        );
        let up = node_ports_up(&t, &h).expect("the ports differ");
        assert_eq!(
            up.iter().map(|p| p.node_port).collect::<Vec<_>>(),
            [Some(31999), Some(30053)]
        );
        assert_eq!(
            up[0].name.as_deref(),
            Some("http"),
            "the tenant's order and names stay"
        );
        let agreed = svc(
            "NodePort",
            json!([{"name": "http", "port": 80, "nodePort": 31999},
                   {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}]),
        );
        assert_eq!(node_ports_up(&agreed, &h), None);
        assert_eq!(node_ports_up(&plain, &h), None);
    }
}
