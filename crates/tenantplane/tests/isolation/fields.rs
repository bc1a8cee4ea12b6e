//! Isolation, second round: every pod field decided, placement through the scheduler's other
//! doors, and the identity host copies run as.

use super::*;
use k8s_openapi::api::core::v1::ServiceAccount;

#[tokio::test]
async fn fields_the_first_round_missed_are_refused_or_capped() {
    // Pod Security lets everything through: only the syncer's field decisions stand in the way.
    let world = TenantSetup::seed()
        .profile_spec(json!({"podSecurity": "privileged"}))
        .start("iso-fields")
        .await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    let with_context = |sc: serde_json::Value| {
        let mut c = container("c");
        c["securityContext"] = sc;
        json!({"containers": [c]})
    };
    let attacks = [
        (
            "gmsa",
            with_context(json!({"windowsOptions": {"gmsaCredentialSpecName": "domain-admins"}})),
            "windowsOptions.gmsaCredentialSpecName is not allowed for tenant pods (the IsolationProfile's allow.privileged is off)",
        ),
        (
            "seccomp",
            json!({"securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/unconfined.json"}}}),
            "seccomp Localhost profile \"profiles/unconfined.json\" is not in the IsolationProfile's allow.localhostProfiles",
        ),
        (
            "apparmor",
            with_context(
                json!({"appArmorProfile": {"type": "Localhost", "localhostProfile": "unconfined-ish"}}),
            ),
            "AppArmor Localhost profile \"unconfined-ish\"",
        ),
        (
            "selinux",
            with_context(json!({"seLinuxOptions": {"level": "s0:c0.c1023"}})),
            "seLinuxOptions.level is not allowed for tenant pods",
        ),
    ];
    for (name, spec, _) in &attacks {
        create(&pods, &pod(name, json!({}), spec.clone())).await;
    }
    // Durations the host would honour for a year are cut to the profile's caps.
    let mut slow = container("c");
    slow["livenessProbe"] =
        json!({"exec": {"command": ["true"]}, "timeoutSeconds": 86400, "periodSeconds": 10});
    slow["lifecycle"] = json!({"preStop": {"sleep": {"seconds": 31536000}}});
    create(
        &pods,
        &pod(
            "year",
            json!({}),
            json!({"containers": [slow], "terminationGracePeriodSeconds": 31536000}),
        ),
    )
    .await;
    let copy = host_copy::<Pod>(host, &ns.name, "year").await;
    let spec = copy.spec.unwrap();
    assert_eq!(spec.termination_grace_period_seconds, Some(300));
    let c = &spec.containers[0];
    assert_eq!(c.liveness_probe.as_ref().unwrap().timeout_seconds, Some(60));
    let stop = c.lifecycle.as_ref().unwrap().pre_stop.as_ref().unwrap();
    assert_eq!(stop.sleep.as_ref().unwrap().seconds, 300);
    let message = told(tenant, "year", "NotCopied").await;
    assert!(
        message.contains("spec.terminationGracePeriodSeconds 31536000 is cut to 300 on the host (the IsolationProfile's allow.durations.terminationGracePeriodSeconds)"),
        "{message}"
    );
    for (name, _, needle) in &attacks {
        let message = told(tenant, name, "NotAllowed").await;
        assert!(message.contains(needle), "{name}: {message}");
        assert!(
            !has_copy::<Pod>(host, &ns.name, name).await,
            "{name} reached the host"
        );
    }
}

#[tokio::test]
async fn topology_keys_steer_only_by_allowed_labels_and_copies_run_as_the_tenants_account() {
    let world = TestHost::start("iso-topo").await;
    let (ns, host) = (&world.ns, &world.host);
    // The platform gave the host namespace's `default` account a pull secret and a cloud
    // identity meant for its own jobs.
    let host_accounts: Api<ServiceAccount> = Api::namespaced(host.clone(), &ns.name);
    host_accounts
        .patch(
            "default",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({
                "metadata": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/platform"}},
                "imagePullSecrets": [{"name": "platform-registry"}]
            })),
        )
        .await
        .unwrap();
    let tenant = TenantSetup::seed().allow(json!({})).ready_in(ns).await;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    let term = |key: &str| json!({"topologyKey": key, "labelSelector": {"matchLabels": {"app": "spread"}}});
    create(
        &pods,
        &pod(
            "spread",
            json!({"app": "spread"}),
            json!({
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": "pool.example.com/team-b", "whenUnsatisfiable": "DoNotSchedule",
                     "labelSelector": {"matchLabels": {"app": "spread"}}},
                    {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
                     "labelSelector": {"matchLabels": {"app": "spread"}}}
                ],
                "affinity": {
                    "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term("pool.example.com/team-b")]},
                    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term("kubernetes.io/hostname")]}
                }
            }),
        ),
    )
    .await;
    let copy = host_copy::<Pod>(host, &ns.name, "spread").await;
    let spec = copy.spec.clone().unwrap();
    let keys: Vec<_> = spec
        .topology_spread_constraints
        .iter()
        .flatten()
        .map(|c| c.topology_key.clone())
        .collect();
    assert_eq!(keys, ["kubernetes.io/hostname"]);
    let affinity = spec.affinity.clone().unwrap();
    assert!(affinity.pod_affinity.is_none_or(|a| {
        a.required_during_scheduling_ignored_during_execution
            .is_none()
    }));
    assert_eq!(
        affinity
            .pod_anti_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()[0]
            .topology_key,
        "kubernetes.io/hostname"
    );
    let message = told(&tenant, "spread", "NotCopied").await;
    for needle in [
        "the topology spread constraint on topology key pool.example.com/team-b is left out",
        "the pod affinity term on topology key pool.example.com/team-b is left out (not in the IsolationProfile's allow.nodeLabelKeys)",
    ] {
        assert!(message.contains(needle), "{needle}: {message}");
    }
    // The copy runs as the tenant's own account: no token, no pull secret but its own.
    assert_eq!(spec.service_account_name.as_deref(), Some("dev-workloads"));
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.image_pull_secrets, None, "the host lent a pull secret");
    let account = host_accounts.get("dev-workloads").await.unwrap();
    assert_eq!(account.automount_service_account_token, Some(false));
    assert_eq!(account.image_pull_secrets, None);
    assert_eq!(
        account.metadata.owner_references.unwrap()[0].kind,
        "TenantCluster"
    );
    // A pull secret the tenant's pod names is the only one its copy has, translated.
    create(
        &pods,
        &pod(
            "pulls",
            json!({}),
            json!({"imagePullSecrets": [{"name": "regcred"}]}),
        ),
    )
    .await;
    let copy = host_copy::<Pod>(host, &ns.name, "pulls").await;
    let secrets: Vec<_> = copy
        .spec
        .unwrap()
        .image_pull_secrets
        .unwrap_or_default()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(secrets, ["regcred-x-default-x-dev"]);
}
