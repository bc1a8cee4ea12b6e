//! Output, identity and how containers end: the container's own logs (`-f`, `--previous`,
//! `--since`), its exit code, reason and termination message, `CrashLoopBackOff` and
//! `OOMKilled`, each as the tenant sees it and as the host shows it.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams};
use serde_json::json;
use tenantplane_testenv::eventually;

use super::common::WAIT;
use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_pod_runs_for_real_and_its_end_reaches_the_tenant() {
    let world = real_tenant("nodes-run").await;
    let tenant = &world.tenant;
    create_pod(
        tenant,
        "hello",
        json!({
            "restartPolicy": "Never",
            "containers": [busybox(
                "c",
                "echo hello from $(hostname); echo to stderr >&2; \
                 echo bye > /dev/termination-log; exit 3"
            )],
        }),
    )
    .await;
    let pod = pod_where(tenant, "hello", "failed", |p| phase(p) == Some("Failed")).await;
    let ended = terminated(&pod).expect("a Failed pod's container has ended");
    assert_eq!(ended.exit_code, 3, "{ended:?}");
    assert_eq!(ended.reason.as_deref(), Some("Error"), "{ended:?}");
    assert_eq!(ended.message.as_deref(), Some("bye\n"), "{ended:?}");
    let logs = Api::<Pod>::namespaced(tenant.clone(), "default")
        .logs("hello", &LogParams::default())
        .await
        .unwrap();
    // stdout and stderr are two pipes, which the runtime logs as it reads each: their lines
    // may come in either order.
    let mut lines: Vec<&str> = logs.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["hello from hello", "to stderr"], "{logs:?}");
}

/// The numbers of `line N` lines.
fn numbers(logs: &str) -> Vec<u64> {
    logs.lines()
        .filter_map(|l| l.strip_prefix("line ")?.trim().parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn logs_follow_and_show_the_previous_run_and_a_recent_window() {
    let world = real_tenant("nodes-logs").await;
    let tenant = &world.tenant;
    create_pod(
        tenant,
        "counter",
        json!({"containers": [busybox(
            "c",
            "i=0; while true; do echo line $i; i=$((i+1)); sleep 1; done"
        )]}),
    )
    .await;
    // The first run says `run 1` and fails; the second says `run 2` and stays (an emptyDir
    // outlives a container's restart).
    create_pod(
        tenant,
        "again",
        json!({
            "containers": [with(
                busybox(
                    "c",
                    "n=$(( $(cat /state/n 2>/dev/null || echo 0) + 1 )); echo $n > /state/n; \
                     echo run $n; [ $n -ge 2 ] && exec sleep 3600; exit 1"
                ),
                "volumeMounts",
                json!([{"name": "state", "mountPath": "/state"}]),
            )],
            "volumes": [{"name": "state", "emptyDir": {}}],
        }),
    )
    .await;
    running(tenant, "counter").await;
    let (_connect, kubeconfig) = connect(&world).await;
    let pods = Api::<Pod>::namespaced(tenant.clone(), "default");

    // -f: lines written after kubectl started keep coming.
    let so_far = numbers(&pods.logs("counter", &LogParams::default()).await.unwrap());
    let later = so_far.last().map_or(0, |n| n + 3);
    let mut follow = spawn_kubectl(&kubeconfig, &["logs", "-f", "counter"]);
    let mut lines = stdout_lines(&mut follow);
    let mut seen = Vec::new();
    while seen.last() != Some(&later) {
        let line = next_line(&mut lines, "kubectl logs -f").await;
        seen.extend(numbers(&line));
    }
    assert_eq!(
        seen,
        (0..=later).collect::<Vec<_>>(),
        "logs -f gives every line, in order, as it is written"
    );
    drop(follow);

    // --since: only the last seconds' lines, the newest among them.
    let enough = eventually(WAIT, || async {
        let all = numbers(&pods.logs("counter", &LogParams::default()).await.ok()?);
        (all.len() >= 10).then_some(all)
    })
    .await
    .expect("the counter wrote ten lines");
    let said = kubectl(&kubeconfig, &["logs", "--since=3s", "counter"], "").await;
    assert_eq!(said.0, 0, "{said:?}");
    let recent = numbers(&said.1);
    assert!(
        !recent.is_empty() && recent.len() <= 5,
        "--since=3s gives the last few lines of a line a second: {said:?}"
    );
    assert!(
        recent[0] + 5 > *enough.last().unwrap_or(&0),
        "--since=3s starts near the end ({enough:?}): {recent:?}"
    );

    // --previous: the run before the restart.
    pod_where(tenant, "again", "restarted once and ran", |p| {
        container(p, "c").is_some_and(|c| {
            c.restart_count == 1 && c.state.as_ref().is_some_and(|s| s.running.is_some())
        })
    })
    .await;
    let previous = kubectl(&kubeconfig, &["logs", "--previous", "again"], "").await;
    assert_eq!(
        (previous.0, previous.1.as_str()),
        (0, "run 1\n"),
        "{previous:?}"
    );
    let current = kubectl(&kubeconfig, &["logs", "again"], "").await;
    assert_eq!(
        (current.0, current.1.as_str()),
        (0, "run 2\n"),
        "{current:?}"
    );
}

/// What a container's end looks like in a pod's status: the restart count, the reason it waits,
/// the last end's reason and exit code.
fn ending(pod: &Pod) -> Option<(i32, Option<String>, Option<String>, i32)> {
    let c = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
    let waiting = c
        .state
        .as_ref()?
        .waiting
        .as_ref()
        .and_then(|w| w.reason.clone());
    let last = c.state.as_ref()?.terminated.as_ref().or(c
        .last_state
        .as_ref()?
        .terminated
        .as_ref())?;
    Some((
        c.restart_count,
        waiting,
        last.reason.clone(),
        last.exit_code,
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn crash_loops_and_oom_kills_reach_the_tenant_as_the_host_shows_them() {
    let world = real_tenant("nodes-end").await;
    let tenant = &world.tenant;
    create_pod(
        tenant,
        "crash",
        json!({"containers": [busybox("c", "echo crashing; exit 2")]}),
    )
    .await;
    // `tail` keeps the last line in memory, and /dev/zero's never ends: past the 16 MiB limit.
    // It is the container's main process (a pipeline's OOM-killed part leaves `sh` to exit 0,
    // which the kubelet still calls OOMKilled).
    let mut hog = busybox("c", "echo allocating; exec tail /dev/zero");
    hog["resources"] = json!({"requests": {"cpu": "10m", "memory": "16Mi"},
                              "limits": {"memory": "16Mi"}});
    create_pod(
        tenant,
        "hog",
        json!({"restartPolicy": "Never", "containers": [hog]}),
    )
    .await;

    // CrashLoopBackOff with a rising restart count, the same in the tenant and on the host.
    let looped = eventually(WAIT, || async {
        let mine = ending(
            &Api::<Pod>::namespaced(tenant.clone(), "default")
                .get("crash")
                .await
                .ok()?,
        )?;
        let host = ending(&host_copy(&world, "crash").await)?;
        let waits = mine.1.as_deref() == Some("CrashLoopBackOff");
        (mine.0 >= 2 && waits && mine == host).then_some(mine)
    })
    .await;
    let Some((restarts, waiting, reason, code)) = looped else {
        panic!(
            "the crash loop never reached the tenant as the host shows it: tenant {:?}, host {:?}",
            Api::<Pod>::namespaced(tenant.clone(), "default")
                .get("crash")
                .await
                .ok()
                .and_then(|p| p.status),
            host_copy(&world, "crash").await.status
        )
    };
    assert!(restarts >= 2);
    assert_eq!(waiting.as_deref(), Some("CrashLoopBackOff"));
    assert_eq!((reason.as_deref(), code), (Some("Error"), 2));

    // OOMKilled under the memory limit.
    let pod = pod_where(tenant, "hog", "failed", |p| phase(p) == Some("Failed")).await;
    let ended = terminated(&pod).expect("a Failed pod's container has ended");
    assert_eq!(
        (ended.reason.as_deref(), ended.exit_code),
        (Some("OOMKilled"), 137),
        "{ended:?}"
    );
    let host = host_copy(&world, "hog").await;
    assert_eq!(
        terminated(&host).map(|t| (&t.reason, t.exit_code)),
        Some((&ended.reason, 137))
    );
    let logs = Api::<Pod>::namespaced(tenant.clone(), "default")
        .logs("hog", &LogParams::default())
        .await
        .unwrap();
    assert_eq!(logs, "allocating\n");
}

/// The CPU quota the container's cgroup has, as the container reads it (cgroup v1's
/// `cpu.cfs_quota_us`, or v2's `cpu.max`): the figure a resize must change.
const CPU_QUOTA: &str = "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null \
    || cut -d' ' -f1 /sys/fs/cgroup/cpu.max";

#[tokio::test(flavor = "multi_thread")]
async fn a_resize_in_the_tenant_resizes_the_running_container() {
    let world = real_tenant("nodes-resize").await;
    let tenant = &world.tenant;
    let mut c = busybox("c", "exec sleep 3600");
    c["resources"] = json!({"requests": {"cpu": "100m", "memory": "32Mi"},
                            "limits": {"cpu": "200m", "memory": "64Mi"}});
    create_pod(tenant, "elastic", json!({"containers": [c]})).await;
    let before = running(tenant, "elastic").await;
    let (_connect, kubeconfig) = connect(&world).await;
    assert_eq!(
        exec_until_ok(&kubeconfig, "elastic", CPU_QUOTA).await,
        "20000\n"
    );
    let restarts = container(&before, "c").unwrap().restart_count;

    // As `kubectl patch pod --subresource resize` does.
    let pods = Api::<Pod>::namespaced(tenant.clone(), "default");
    pods.patch_subresource(
        "resize",
        "elastic",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Strategic(json!({"spec": {"containers": [{"name": "c",
            "resources": {"requests": {"cpu": "150m"}, "limits": {"cpu": "300m"}}}]}})),
    )
    .await
    .unwrap();
    // The kubelet's account of it reaches the tenant: the container runs with the new
    // resources, and the tenant's new generation is observed.
    let resized = pod_where(tenant, "elastic", "showed the resize", |p| {
        let limits = container(p, "c")
            .and_then(|c| c.resources.as_ref())
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("cpu"))
            .map(|q| q.0.clone());
        let observed = p.status.as_ref().and_then(|s| s.observed_generation);
        limits.as_deref() == Some("300m") && observed == p.metadata.generation
    })
    .await;
    let host = host_copy(&world, "elastic").await;
    let host_limits = host.spec.unwrap().containers[0]
        .resources
        .clone()
        .unwrap()
        .limits
        .unwrap();
    assert_eq!(host_limits["cpu"].0, "300m");
    assert_eq!(
        exec_until_ok(&kubeconfig, "elastic", CPU_QUOTA).await,
        "30000\n",
        "the cgroup follows the resize"
    );
    assert_eq!(
        container(&resized, "c").unwrap().restart_count,
        restarts,
        "a CPU resize does not restart the container"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_safe_sysctl_is_set_in_the_pod_and_its_start_is_told() {
    let world = real_tenant("nodes-sysctl").await;
    let tenant = &world.tenant;
    create_pod(
        tenant,
        "tuned",
        json!({
            "restartPolicy": "Never",
            "securityContext": {"sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"}]},
            "containers": [busybox("c", "sysctl kernel.shm_rmid_forced")],
        }),
    )
    .await;
    let pod = pod_where(tenant, "tuned", "succeeded", |p| {
        phase(p) == Some("Succeeded")
    })
    .await;
    let logs = Api::<Pod>::namespaced(tenant.clone(), "default")
        .logs("tuned", &LogParams::default())
        .await
        .unwrap();
    assert_eq!(logs.trim(), "kernel.shm_rmid_forced = 1", "{pod:?}");
    // The kubelet's Events about the container reach the tenant pod, its start among them
    // (what a client waiting for "Started" or an error looks for), even for one that ended at once.
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(tenant.clone(), "default");
    let reasons = eventually(WAIT, || async {
        let reasons: Vec<String> = events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|e| e.involved_object.uid == pod.metadata.uid)
            .filter_map(|e| e.reason)
            .collect();
        reasons.iter().any(|r| r == "Started").then_some(reasons)
    })
    .await;
    assert!(reasons.is_some(), "the tenant pod was never told Started");
}

/// A pod bound by name runs on that node, placed there by the host scheduler (so other teams'
/// pods, taints and room hold); one that node cannot take fails, as a kubelet refuses such a pod
/// at admission (a StatefulSet then makes its evicted pod again), and its copy goes; one named
/// for a node the tenant has no access to is placed by the host scheduler.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_bound_by_name_is_placed_there_by_the_host_scheduler_or_fails() {
    use_real_nodes();
    let world = TestHost::start_with_kubelet("nodes-byname")
        .await
        .ready(
            TenantSetup::seed()
                .allow(json!({"hostPorts": true}))
                .profile_spec(json!({"podSecurity": "privileged"})),
        )
        .await;
    let tenant = &world.tenant;
    let mut holder = busybox("c", "exec sleep 3600");
    holder["ports"] = json!([{"containerPort": 21018, "hostPort": 21018}]);
    create_pod(tenant, "holder", json!({"containers": [holder.clone()]})).await;
    let node = running(tenant, "holder")
        .await
        .spec
        .and_then(|s| s.node_name)
        .unwrap();
    // Named for the node: its copy goes there through the host scheduler, which honours other
    // teams' pods, taints and room; never bound around it.
    create_pod(
        tenant,
        "beside",
        json!({"nodeName": node, "containers": [busybox("c", "exec sleep 3600")]}),
    )
    .await;
    running(tenant, "beside").await;
    let copy = host_copy(&world, "beside").await;
    let spec = copy.spec.unwrap();
    assert_eq!(spec.node_name.as_deref(), Some(node.as_str()));
    assert!(
        serde_json::to_string(&spec.affinity)
            .unwrap()
            .contains("metadata.name"),
        "the copy was not pinned by affinity"
    );
    // Its host port taken there: the scheduler holds the copy, and the tenant pod fails as a
    // kubelet would refuse it; the copy goes, and is not made again.
    create_pod(
        tenant,
        "clash",
        json!({"nodeName": node, "restartPolicy": "Never", "containers": [holder]}),
    )
    .await;
    let tenant_pods = Api::<Pod>::namespaced(tenant.clone(), "default");
    let failed = eventually(WAIT, || async {
        let clash = tenant_pods.get("clash").await.ok()?;
        (phase(&clash) == Some("Failed")).then_some(clash.status?)
    })
    .await
    .expect("the pod whose host port is taken never failed");
    assert_eq!(
        failed.reason.as_deref(),
        Some(tenantplane_syncer::kinds::pods::binding::REJECTED)
    );
    assert!(
        failed
            .message
            .as_deref()
            .unwrap_or_default()
            .contains(&node),
        "{failed:?}"
    );
    let copies = Api::<Pod>::namespaced(world.host.clone(), &world.ns.name);
    let clash_copy = tenantplane_syncer::naming::host_name_for(&world.name, "default", "clash");
    let gone = eventually(WAIT, || async {
        copies
            .get_opt(&clash_copy)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    assert!(gone.is_some(), "the refused pod's copy stayed");
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(
        copies.get_opt(&clash_copy).await.unwrap().is_none(),
        "a copy of the ended pod was made again"
    );
    // A node the tenant cannot run on (here: none of that name): the host places the copy.
    create_pod(
        tenant,
        "nowhere",
        json!({"nodeName": "no-such-node", "containers": [busybox("c", "exec sleep 3600")]}),
    )
    .await;
    let copy = eventually(WAIT, || async {
        let copy = Api::<Pod>::namespaced(world.host.clone(), &world.ns.name)
            .get(&tenantplane_syncer::naming::host_name_for(
                &world.name,
                "default",
                "nowhere",
            ))
            .await
            .ok()?;
        copy.spec?.node_name
    })
    .await;
    assert!(
        copy.is_some(),
        "the host never placed the copy of a pod named for an unknown node"
    );
}

/// An evicted Job pod ends as a kubelet ends a deleted pod, `Failed`, before it goes: a pod
/// failure policy that ignores disruptions waits for that, then lets the pod go and makes a
/// new one without counting a failure.
#[tokio::test(flavor = "multi_thread")]
async fn an_evicted_job_pod_ends_failed_and_the_policy_ignores_it() {
    use k8s_openapi::api::batch::v1::Job;
    let world = real_tenant("nodes-evict").await;
    let tenant = &world.tenant;
    let job: Job = create(
        tenant,
        json!({
            "metadata": {"name": "work", "namespace": "default"},
            "spec": {
                "backoffLimit": 0,
                "podFailurePolicy": {"rules": [{"action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget"}]}]},
                "template": {"spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                    "containers": [busybox("c", "exec sleep 3600")]}}
            }
        }),
    )
    .await;
    let pods = Api::<Pod>::namespaced(tenant.clone(), "default");
    let selector = format!(
        "batch.kubernetes.io/job-name={}",
        job.metadata.name.unwrap()
    );
    let first = eventually(WAIT, || async {
        let list = pods
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .ok()?;
        list.items
            .into_iter()
            .find(|p| phase(p) == Some("Running"))
            .map(|p| p.metadata.name.unwrap())
    })
    .await
    .expect("the Job's pod never ran");
    pods.evict(&first, &Default::default()).await.unwrap();
    let gone = eventually(WAIT, || async {
        pods.get_opt(&first).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "the evicted pod stayed: {:?}",
        pods.get_opt(&first)
            .await
            .ok()
            .flatten()
            .and_then(|p| p.status)
    );
    let replaced = eventually(WAIT, || async {
        let list = pods
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .ok()?;
        list.items
            .iter()
            .any(|p| {
                p.metadata.name.as_deref() != Some(first.as_str()) && phase(p) == Some("Running")
            })
            .then_some(())
    })
    .await;
    if replaced.is_none() {
        let job = Api::<Job>::namespaced(tenant.clone(), "default")
            .get("work")
            .await
            .unwrap();
        let list = pods
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .unwrap();
        let seen: Vec<_> = list
            .items
            .iter()
            .map(|p| (p.metadata.name.clone(), phase(p).map(str::to_string)))
            .collect();
        panic!(
            "the Job never ran a new pod: {:?}; pods {seen:?}",
            job.status
        );
    }
    let job = Api::<Job>::namespaced(tenant.clone(), "default")
        .get("work")
        .await
        .unwrap();
    assert_eq!(
        job.status.and_then(|s| s.failed).unwrap_or(0),
        0,
        "the disruption was counted as a failure"
    );
}

/// An image pull's error reaches the tenant without the host node's resolver, or any address of
/// the host's: the kubelet's message names where the node looked the registry up.
#[tokio::test(flavor = "multi_thread")]
async fn an_image_pull_error_names_no_address_of_the_host() {
    let world = real_tenant("nodes-pull").await;
    let tenant = &world.tenant;
    let mut c = busybox("c", "true");
    c["image"] = "registry.nosuch.invalid/app:1.0".into();
    create_pod(tenant, "unpullable", json!({"containers": [c]})).await;
    let pull_error = |p: &Pod| {
        waiting(p)?
            .message
            .clone()
            .filter(|m| m.contains("registry.nosuch.invalid"))
    };
    let pod = pod_where(
        tenant,
        "unpullable",
        "told why its image does not pull",
        |p| pull_error(p).is_some(),
    )
    .await;
    let message = pull_error(&pod).unwrap_or_default();
    // What the host's kubelet said, on the copy: the addresses it named.
    let copy = host_copy(&world, "unpullable").await;
    let host_said = pull_error(&copy).unwrap_or_default();
    let addresses = |text: &str| -> Vec<String> {
        text.split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .map(|w| w.trim_matches('.'))
            .filter(|w| {
                w.parse::<std::net::Ipv4Addr>()
                    .is_ok_and(|ip| !ip.is_loopback())
            })
            .map(str::to_string)
            .collect()
    };
    println!("the host said: {host_said}\nthe tenant read: {message}");
    assert_eq!(
        addresses(&message),
        Vec::<String>::new(),
        "the tenant read a host address: {message}"
    );
    if !addresses(&host_said).is_empty() {
        assert!(message.contains("<host address>"), "{message}");
    }
}
