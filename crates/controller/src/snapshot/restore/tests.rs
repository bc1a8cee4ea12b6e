//! The restore's decisions, in memory: what may be restored, and how a restore ends.

use super::*;

#[test]
fn a_snapshot_is_restorable_only_when_granted_completed_not_newer_and_received() {
    let tc: TenantCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "tenantplane.io/v1alpha1", "kind": "TenantCluster",
        "metadata": {"name": "dev", "namespace": "team-b"},
        "spec": {"kubernetesVersion": "v1.31.4"}
    }))
    .unwrap();
    let snap = |annotations: serde_json::Value, phase: &str, version: &str| -> TenantSnapshot {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "tenantplane.io/v1alpha1", "kind": "TenantSnapshot",
            "metadata": {"name": "s1", "namespace": "team-a", "annotations": annotations},
            "spec": {"tenantClusterRef": {"name": "dev"}},
            "status": {"phase": phase, "message": "m", "kubernetesVersion": version}
        }))
        .unwrap()
    };
    let build = crate::BuildOptions::default();
    let granted = serde_json::json!({RESTORE_TO: "team-c, team-b"});
    let ok = snap(granted.clone(), "Completed", "v1.31.0");
    assert_eq!(admissible(&tc, &build, &ok, "team-a", "s1"), Ok(()));
    // Its own namespace needs no grant.
    assert_eq!(admissible(&tc, &build, &ok, "team-b", "s1"), Ok(()));
    let cases = [
        (
            snap(serde_json::json!({}), "Completed", "v1.31.0"),
            "NotGranted",
        ),
        (snap(granted.clone(), "Failed", "v1.31.0"), "NotCompleted"),
        (snap(granted.clone(), "Completed", "v1.32.1"), "NewerMinor"),
    ];
    for (s, want) in cases {
        let got = admissible(&tc, &build, &s, "team-a", "s1").unwrap_err();
        assert!(format!("{got:?}").starts_with(want), "{want}: {got:?}");
    }
    let none = crate::BuildOptions {
        agent_image: None,
        ..Default::default()
    };
    assert_eq!(
        admissible(&tc, &none, &ok, "team-a", "s1"),
        Err(NotRestorable::NoAgent)
    );
    let failed = admissible(
        &tc,
        &build,
        &snap(granted, "Failed", "v1.31.0"),
        "team-a",
        "s1",
    );
    assert_eq!(
        failed.unwrap_err().to_string(),
        "TenantSnapshot team-a/s1 is Failed, not Completed: m"
    );
}

#[test]
fn how_a_restore_ended_is_its_last_status_and_its_event() {
    let under_way = |in_place| RestoreStatus {
        snapshot: "team-a/nightly".into(),
        phase: Some(RestorePhase::Restoring),
        id: Some("0123456789ab".into()),
        in_place,
        ..Default::default()
    };
    let (done, event, reason) = finished(under_way(true), Outcome::Restored("3 MiB".into()));
    assert_eq!(done.phase, Some(RestorePhase::Completed));
    assert_eq!(
        done.message.as_deref(),
        Some("restored snapshot team-a/nightly: 3 MiB")
    );
    assert!(done.completion_time.is_some());
    assert_eq!(done.id.as_deref(), Some("0123456789ab"));
    assert_eq!((event, reason), (EventType::Normal, "Restored"));
    // Given up: a tenant restored in place runs on; a new one waits for another snapshot.
    for (in_place, then) in [
        (true, "the tenant went on with the data it had"),
        (false, "point spec.restore at another snapshot"),
    ] {
        let (failed, event, reason) = finished(
            under_way(in_place),
            Outcome::Abandoned("checksum differs".into()),
        );
        assert_eq!(failed.phase, Some(RestorePhase::Failed));
        let message = failed.message.unwrap_or_default();
        assert!(
            message.starts_with("restoring snapshot team-a/nightly failed: checksum differs; ")
                && message.contains(then),
            "{message}"
        );
        assert_eq!((event, reason), (EventType::Warning, "RestoreFailed"));
    }
}

#[test]
fn a_restore_id_is_short_and_changes_with_the_request() {
    let a = restore_id("uid-1", None);
    assert_eq!(a.len(), 12);
    assert_eq!(a, restore_id("uid-1", None));
    assert_ne!(a, restore_id("uid-1", Some("2026-12-05T01:00:00Z")));
    assert_ne!(a, restore_id("uid-2", None));
}

#[test]
fn the_running_version_is_the_servers_image_tag() {
    let pod = |name: &str, image: &str| -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "spec": {"containers": [
                {"name": "snapshot-agent", "image": "tenantplane/tenantplane:v0.1.0"},
                {"name": name, "image": image},
            ]}
        }))
        .unwrap()
    };
    let version = crate::build::control_plane::running_version;
    assert_eq!(
        version(&pod("k3s", "rancher/k3s:v1.30.4-k3s1")).as_deref(),
        Some("v1.30.4")
    );
    assert_eq!(
        version(&pod(
            "kube-apiserver",
            "registry.k8s.io/kube-apiserver:v1.36.3"
        ))
        .as_deref(),
        Some("v1.36.3")
    );
    assert_eq!(version(&pod("k3s", "mirror.example/k3s:latest")), None);
    assert_eq!(version(&pod("k3s", "mirror.example/k3s")), None);
}

#[test]
fn minors_are_read_from_versions() {
    assert_eq!(minor("v1.31.4"), Some(31));
    assert_eq!(minor("v1.36.3+k3s1"), Some(36));
    assert_eq!(minor("nonsense"), None);
}
