//! Into a running container from the tenant, through `tenantplane connect`'s kubeconfig and the
//! virtual node's kubelet endpoint: `exec` with stdin, `cp` both ways, `attach`, `debug`
//! (ephemeral containers: started in the running copy, or refused by the profile) and
//! `port-forward`.

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tenantplane_testenv::shared;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn exec_cp_and_attach_reach_the_container() {
    let world = real_tenant("nodes-exec").await;
    let tenant = &world.tenant;
    create_pod(
        tenant,
        "shell",
        json!({"containers": [busybox("c", "sleep 3600")]}),
    )
    .await;
    let mut cat = busybox("c", "exec cat");
    cat["stdin"] = true.into();
    cat["tty"] = false.into();
    create_pod(tenant, "echo", json!({"containers": [cat]})).await;
    running(tenant, "shell").await;
    let (_connect, kubeconfig) = connect(&world).await;

    // exec -i: stdin reaches the process, and the command ends when stdin does.
    let said = kubectl(
        &kubeconfig,
        &["exec", "-i", "shell", "--", "cat"],
        "line one\nline two\n",
    )
    .await;
    assert_eq!(said.0, 0, "{said:?}");
    assert_eq!(said.1, "line one\nline two\n", "{said:?}");
    let said = kubectl(&kubeconfig, &["exec", "shell", "--", "hostname"], "").await;
    assert_eq!(said.1.trim(), "shell", "the tenant pod's name: {said:?}");
    let said = kubectl(
        &kubeconfig,
        &["exec", "shell", "--", "sh", "-c", "exit 7"],
        "",
    )
    .await;
    assert_eq!(said.0, 7, "exec's exit code comes back: {said:?}");

    // cp into the container and back out (kubectl cp runs tar in the container).
    let dir = shared().dir().join(format!("{}-cp", world.ns.name));
    std::fs::create_dir_all(&dir).unwrap();
    let sent = dir.join("sent.txt");
    std::fs::write(&sent, "copied in\n").unwrap();
    let said = kubectl(
        &kubeconfig,
        &["cp", sent.to_str().unwrap(), "shell:/tmp/in.txt"],
        "",
    )
    .await;
    assert_eq!(said.0, 0, "kubectl cp in: {said:?}");
    let said = kubectl(
        &kubeconfig,
        &["exec", "shell", "--", "cat", "/tmp/in.txt"],
        "",
    )
    .await;
    assert_eq!(said.1, "copied in\n", "{said:?}");
    let said = kubectl(
        &kubeconfig,
        &[
            "exec",
            "shell",
            "--",
            "sh",
            "-c",
            "echo made inside > /tmp/out.txt",
        ],
        "",
    )
    .await;
    assert_eq!(said.0, 0, "{said:?}");
    let back = dir.join("back.txt");
    let said = kubectl(
        &kubeconfig,
        &["cp", "shell:/tmp/out.txt", back.to_str().unwrap()],
        "",
    )
    .await;
    assert_eq!(said.0, 0, "kubectl cp out: {said:?}");
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "made inside\n");

    // attach -i: what goes to the container's stdin comes back from its `cat`.
    running(tenant, "echo").await;
    let mut attach = spawn_kubectl(&kubeconfig, &["attach", "-i", "echo"]);
    let mut input = attach.stdin.take().unwrap();
    let mut lines = stdout_lines(&mut attach);
    input.write_all(b"through attach\n").await.unwrap();
    input.flush().await.unwrap();
    let line = next_line(&mut lines, "kubectl attach").await;
    assert_eq!(line, "through attach");
    drop(input);
    drop(attach);
}

#[tokio::test(flavor = "multi_thread")]
async fn port_forward_and_debug_from_the_tenant() {
    let world = real_tenant("nodes-fwd").await;
    let tenant = &world.tenant;
    create_pod(
        tenant,
        "server",
        json!({"containers": [agnhost("c", &["netexec", "--http-port=8080", "--udp-port=8081"])]}),
    )
    .await;
    running(tenant, "server").await;
    let (_connect, kubeconfig) = connect(&world).await;

    // port-forward: a local port reaches the server in the container. A connection through the
    // chain of forwards (connect, the host API server, the tenant's, the kubelet) may be cut while
    // a hop is still being set up on a loaded machine, or before the server in the container
    // listens; kubectl then ends its port-forward, and a user runs it again.
    let mut answers = Vec::new();
    for _ in 0..5 {
        let answer = forwarded_get(&kubeconfig, "/hostname").await;
        if answer.ends_with("\r\n\r\nserver") {
            break;
        }
        answers.push(answer);
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
    assert!(
        answers.len() < 5,
        "port-forward never reached the server: {answers:?}"
    );

    // debug: an ephemeral container starts in the running pod, logs, and takes exec.
    let custom = shared().dir().join(format!("{}-debug.json", world.ns.name));
    std::fs::write(&custom, r#"{"securityContext": {"runAsUser": 1000}}"#).unwrap();
    let said = kubectl(
        &kubeconfig,
        &[
            "debug",
            "server",
            "--image",
            BUSYBOX,
            "--profile=restricted",
            "--custom",
            custom.to_str().unwrap(),
            "--target=c",
            "-c",
            "dbg",
            "--",
            "sh",
            "-c",
            "echo debugging $(hostname); sleep 3600",
        ],
        "",
    )
    .await;
    assert_eq!(said.0, 0, "kubectl debug: {said:?}");
    let debugged = pod_where(tenant, "server", "ran its ephemeral container", |p| {
        p.status
            .iter()
            .flat_map(|s| s.ephemeral_container_statuses.iter().flatten())
            .any(|c| c.name == "dbg" && c.state.as_ref().is_some_and(|s| s.running.is_some()))
    })
    .await;
    let restarts = |p: &Pod| {
        p.status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
            .map(|c| c.restart_count)
            .sum::<i32>()
    };
    assert_eq!(restarts(&debugged), 0, "the pod ran on: {debugged:?}");
    let logs = kubectl_until(&kubeconfig, &["logs", "server", "-c", "dbg"], "debugging").await;
    assert_eq!(
        logs.trim(),
        "debugging server",
        "the tenant pod's name: {logs:?}"
    );
    let said = kubectl(
        &kubeconfig,
        &["exec", "server", "-c", "dbg", "--", "echo", "marco"],
        "",
    )
    .await;
    assert_eq!((said.0, said.1.trim()), (0, "marco"), "{said:?}");
    // It shares the target's process namespace: the server is there to look at.
    let said = kubectl(
        &kubeconfig,
        &["exec", "server", "-c", "dbg", "--", "ps"],
        "",
    )
    .await;
    assert!(
        said.1.contains("netexec"),
        "the target's processes: {said:?}"
    );
    let copy = host_copy(&world, "server").await;
    let started = copy
        .spec
        .and_then(|s| s.ephemeral_containers)
        .unwrap_or_default();
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(started[0].target_container_name.as_deref(), Some("c"));

    // One the profile forbids (privileged) is refused by the tenant API server itself, with Pod
    // Security's message, as in any cluster under `restricted`; the pod runs on with its first
    // debug container.
    let said = kubectl(
        &kubeconfig,
        &[
            "debug",
            "server",
            "--image",
            BUSYBOX,
            "--profile=sysadmin",
            "-c",
            "root",
            "--",
            "sleep",
            "3600",
        ],
        "",
    )
    .await;
    assert_ne!(said.0, 0, "the tenant's API refuses it: {said:?}");
    assert!(
        said.2
            .contains("violates PodSecurity \"restricted:latest\"")
            && said.2.contains("privileged"),
        "{said:?}"
    );
    let copy = host_copy(&world, "server").await;
    let started: Vec<String> = copy
        .spec
        .and_then(|s| s.ephemeral_containers)
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(started, vec!["dbg".to_string()]);
    let pod = running(tenant, "server").await;
    assert_eq!(restarts(&pod), 0);
}

/// `kubectl ARGS` until its output holds `want` (a container's first lines take a moment).
async fn kubectl_until(kubeconfig: &std::path::Path, args: &[&str], want: &str) -> String {
    let found = eventually(WAIT, || async {
        let said = kubectl(kubeconfig, args, "").await;
        (said.0 == 0 && said.1.contains(want)).then_some(said.1)
    })
    .await;
    found.unwrap_or_else(|| panic!("kubectl {args:?} never said {want:?}"))
}

/// An HTTP/1.0 GET of `path` from 127.0.0.1:`port`: the whole answer.
/// `GET path` from pod `server`'s port 8080 through a `kubectl port-forward` of its own.
async fn forwarded_get(kubeconfig: &std::path::Path, path: &str) -> String {
    let mut forward = spawn_kubectl(
        kubeconfig,
        &["port-forward", "pod/server", "--address=127.0.0.1", ":8080"],
    );
    let mut lines = stdout_lines(&mut forward);
    let line = next_line(&mut lines, "kubectl port-forward").await;
    let port: u16 = line
        .strip_prefix("Forwarding from 127.0.0.1:")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("port-forward said {line:?}"));
    http_get(port, path).await
}

async fn http_get(port: u16, path: &str) -> String {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
            .await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    match tokio::time::timeout(std::time::Duration::from_secs(30), attempt).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => format!("(error: {e})"),
        Err(_) => "(no answer within 30 s)".to_string(),
    }
}
