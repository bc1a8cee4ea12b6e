//! The real node of the test control plane: a pod's container really runs, from an image pulled
//! from the local registry, with the kubelet's logs, exit code and pod IP. Runs only in a network
//! namespace of its own (`make test` starts the tests in one); elsewhere it fails with the reason.

use std::process::Output;
use std::time::{Duration, Instant};

use tenantplane_testenv::host_cluster::KWOK_NODE;
use tenantplane_testenv::host_cluster::real_node::{self, BRIDGE, NODE_IP};
use tenantplane_testenv::{ControlPlane, Nodes, Options};

/// The taint this test has the simulated node take: no operator runs here, so a name of its own.
const SIMULATED_TAINT: &str = "testenv.example/simulated";

fn kubectl(plane: &ControlPlane, args: &[&str]) -> Output {
    plane.kubectl().args(args).output().expect("kubectl runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn wait_for(plane: &ControlPlane, what: &str, args: &[&str], want: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = kubectl(plane, args);
        if String::from_utf8_lossy(&out.stdout).trim() == want {
            return;
        }
        if Instant::now() > deadline {
            panic!(
                "timed out waiting for {what}: last {:?}\n{}",
                text(&out),
                plane.logs_tail(30)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn a_pod_runs_a_real_container_pulled_from_the_local_registry() {
    let plane = ControlPlane::start(Options {
        progress: true,
        nodes: Nodes::Real {
            simulated_taint: SIMULATED_TAINT,
        },
        ..Default::default()
    })
    .expect("the control plane with a real node starts");
    assert_no_way_out();
    let taints = kubectl(
        &plane,
        &[
            "get",
            "node",
            KWOK_NODE,
            "-o",
            "jsonpath={.spec.taints[*].key}",
        ],
    );
    assert!(
        text(&taints)
            .split_whitespace()
            .any(|t| t == SIMULATED_TAINT),
        "the simulated node's taints: {}",
        text(&taints)
    );
    let pod = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"hello","namespace":"default"},
      "spec":{"restartPolicy":"Never","containers":[{"name":"c","image":"busybox",
      "command":["sh","-c","echo hello from $(hostname); exit 3"]}]}}"#;
    let path = plane.dir().join("hello.json");
    std::fs::write(&path, pod).expect("write");
    let out = kubectl(&plane, &["apply", "-f", &path.display().to_string()]);
    assert!(out.status.success(), "{}", text(&out));
    wait_for(
        &plane,
        "the pod to fail with its exit code",
        &[
            "get",
            "pod",
            "hello",
            "-o",
            "jsonpath={.status.containerStatuses[0].state.terminated.exitCode}",
        ],
        "3",
    );
    let logs = kubectl(&plane, &["logs", "hello"]);
    assert_eq!(text(&logs).trim(), "hello from hello");
    let ip = kubectl(
        &plane,
        &["get", "pod", "hello", "-o", "jsonpath={.status.podIP}"],
    );
    assert!(
        String::from_utf8_lossy(&ip.stdout).starts_with(NODE_IP.trim_end_matches(char::is_numeric)),
        "{}",
        text(&ip)
    );
    assert_no_way_out();
}

/// No packet can leave: no default route, and every route (of every table) goes over loopback,
/// the node's bridge or a pod's veth, all made in this namespace.
fn assert_no_way_out() {
    real_node::isolated().expect("the namespace is isolated");
    let out = std::process::Command::new("ip")
        .args(["-o", "route", "show", "table", "all"])
        .output()
        .expect("ip runs");
    let routes = String::from_utf8_lossy(&out.stdout);
    for route in routes.lines() {
        let dev = route
            .split_whitespace()
            .skip_while(|w| *w != "dev")
            .nth(1)
            .unwrap_or_default();
        assert!(
            route.split_whitespace().next() != Some("default"),
            "a default route: {route}"
        );
        assert!(
            dev == "lo" || dev == BRIDGE || dev.starts_with("veth"),
            "a route over an interface this namespace did not make: {route}"
        );
    }
}
