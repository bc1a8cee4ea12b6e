//! Default deny at the level of fields: every field of the pod types a host copy carries has a
//! decision here, and a field without one is refused. A Kubernetes release that adds a field
//! therefore adds nothing to host copies until someone decides about it (the unit test below
//! walks k8s-openapi's schema and fails on an undecided field).
//!
//! The decisions that need a value (a seccomp type, a capability, a node label key) are made by
//! the checks in `pods.rs` and the translation in `kinds/pods/translate.rs`; this table says
//! which field goes where, and refuses outright what is refused whatever its value.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use k8s_openapi::api::core::v1::PodSpec;
use serde_json::Value;
use tenantplane_api::Allowances;

/// What becomes of a field of a tenant pod on its host copy.
#[derive(Clone, Copy, Debug)]
pub enum Decision {
    /// Copied as written: it acts only inside the pod's own sandbox.
    Copy,
    /// Rewritten into host names, or to the tenant's own resources (`kinds::pods::translate`).
    Translate,
    /// Left off the copy: the host decides it (scheduling, priority, identity).
    Clear,
    /// Checked by value (`pod_refusals`, the placement checks): refused or left out when the
    /// profile does not allow the value.
    Check,
    /// Capped by the profile's `allow.durations`.
    Bound,
    /// Refused whenever set, unless the named profile setting opens it.
    Refuse {
        /// The profile setting that opens the field, as a person writes it.
        setting: &'static str,
        /// Whether the profile opens it.
        open: fn(&Allowances) -> bool,
    },
    /// Refused whenever set: nothing on this host serves it for a tenant.
    Never {
        /// What to tell the person whose pod sets it.
        hint: &'static str,
    },
}

use Decision::*;

fn privileged(a: &Allowances) -> bool {
    a.privileged
}

const PVC_HINT: &str = "; use a PersistentVolumeClaim";
const PRIVILEGED: Decision = Refuse {
    setting: "privileged",
    open: privileged,
};

/// Every field of every pod type a host copy carries, by the type's name in the OpenAPI schema
/// (`io.k8s.api.core.v1.` left out).
pub const FIELDS: &[(&str, &[(&str, Decision)])] = &[
    (
        "PodSpec",
        &[
            ("activeDeadlineSeconds", Bound),
            ("affinity", Check),
            ("automountServiceAccountToken", Clear),
            ("containers", Copy),
            ("dnsConfig", Translate),
            ("dnsPolicy", Translate),
            ("enableServiceLinks", Translate),
            // Never on create (the API allows them only through the ephemeralcontainers
            // subresource); each is then judged and translated as the pod's only container
            // would be (`kinds::pods::ephemeral`), and started through the copy's subresource.
            ("ephemeralContainers", Clear),
            ("hostAliases", Copy),
            ("hostIPC", Check),
            ("hostNetwork", Check),
            ("hostPID", Check),
            ("hostUsers", Copy),
            ("hostname", Translate),
            // The pod's own hostname, in its own UTS namespace (a kubelet writes no full name
            // for it, so the syncer's hosts file is not needed: `kinds::pods::hosts`).
            ("hostnameOverride", Copy),
            ("imagePullSecrets", Translate),
            ("initContainers", Copy),
            ("nodeName", Clear),
            ("nodeSelector", Check),
            ("os", Copy),
            ("overhead", Clear),
            ("preemptionPolicy", Clear),
            ("priority", Clear),
            ("priorityClassName", Check),
            ("readinessGates", Copy),
            ("resourceClaims", Check),
            // Pod-level requests and limits: each resource name decided (`resources.rs`).
            ("resources", Check),
            ("restartPolicy", Copy),
            ("runtimeClassName", Check),
            ("schedulerName", Clear),
            // A PodGroup of the tenant's, which the host's scheduler cannot see: placement is
            // the host's.
            ("schedulingGroup", Clear),
            // A gated copy would wait for a host controller that never comes: the gate is the
            // tenant's, and the copy is made once the tenant lifts it.
            ("schedulingGates", Clear),
            ("securityContext", Copy),
            ("serviceAccount", Translate),
            ("serviceAccountName", Translate),
            // The host's full name would be the hostname: left out, said (`review`).
            ("setHostnameAsFQDN", Translate),
            ("shareProcessNamespace", Copy),
            ("subdomain", Translate),
            ("terminationGracePeriodSeconds", Bound),
            ("tolerations", Check),
            ("topologySpreadConstraints", Check),
            ("volumes", Copy),
        ],
    ),
    ("Container", CONTAINER),
    // Every field of a Container too (see `decision`), and the container it targets is the
    // tenant's own.
    ("EphemeralContainer", &[("targetContainerName", Copy)]),
    (
        "PodSecurityContext",
        &[
            ("appArmorProfile", Copy),
            ("fsGroup", Copy),
            ("fsGroupChangePolicy", Copy),
            ("runAsGroup", Copy),
            ("runAsNonRoot", Copy),
            ("runAsUser", Copy),
            ("seLinuxChangePolicy", Copy),
            ("seLinuxOptions", Copy),
            ("seccompProfile", Copy),
            ("supplementalGroups", Copy),
            ("supplementalGroupsPolicy", Copy),
            ("sysctls", Check),
            ("windowsOptions", Copy),
        ],
    ),
    (
        "SecurityContext",
        &[
            ("allowPrivilegeEscalation", Copy),
            ("appArmorProfile", Copy),
            ("capabilities", Copy),
            ("privileged", Check),
            ("procMount", Check),
            ("readOnlyRootFilesystem", Copy),
            ("runAsGroup", Copy),
            ("runAsNonRoot", Copy),
            ("runAsUser", Copy),
            ("seLinuxOptions", Copy),
            ("seccompProfile", Copy),
            ("windowsOptions", Copy),
        ],
    ),
    (
        "WindowsSecurityContextOptions",
        &[
            // A credential spec is a cluster-wide object of the host (a domain identity).
            ("gmsaCredentialSpec", PRIVILEGED),
            ("gmsaCredentialSpecName", PRIVILEGED),
            ("hostProcess", Check),
            ("runAsUserName", Copy),
        ],
    ),
    (
        "SeccompProfile",
        &[("localhostProfile", Check), ("type", Check)],
    ),
    (
        "AppArmorProfile",
        &[("localhostProfile", Check), ("type", Check)],
    ),
    (
        "SELinuxOptions",
        &[
            // A level chooses whose files a container can read: only with privileged.
            ("level", PRIVILEGED),
            ("role", Check),
            ("type", Check),
            ("user", Check),
        ],
    ),
    ("Capabilities", &[("add", Check), ("drop", Copy)]),
    (
        "ContainerPort",
        &[
            ("containerPort", Copy),
            ("hostIP", Check),
            ("hostPort", Check),
            ("name", Copy),
            ("protocol", Copy),
        ],
    ),
    (
        "VolumeMount",
        &[
            ("mountPath", Copy),
            // Bidirectional needs a privileged container, which the API server checks.
            ("mountPropagation", Copy),
            ("name", Copy),
            ("readOnly", Copy),
            ("recursiveReadOnly", Copy),
            ("subPath", Copy),
            ("subPathExpr", Copy),
        ],
    ),
    (
        "Probe",
        &[
            ("exec", Copy),
            ("failureThreshold", Copy),
            ("grpc", Copy),
            ("httpGet", Copy),
            ("initialDelaySeconds", Copy),
            ("periodSeconds", Copy),
            ("successThreshold", Copy),
            ("tcpSocket", Copy),
            ("terminationGracePeriodSeconds", Bound),
            ("timeoutSeconds", Bound),
        ],
    ),
    (
        "Lifecycle",
        &[("postStart", Copy), ("preStop", Copy), ("stopSignal", Copy)],
    ),
    (
        "LifecycleHandler",
        &[
            ("exec", Copy),
            ("httpGet", Copy),
            ("sleep", Bound),
            ("tcpSocket", Copy),
        ],
    ),
    // The kubelet dials a probe's or hook's host from the node's network.
    (
        "HTTPGetAction",
        &[
            ("host", Check),
            ("httpHeaders", Copy),
            ("path", Copy),
            ("port", Copy),
            ("scheme", Copy),
        ],
    ),
    ("TCPSocketAction", &[("host", Check), ("port", Copy)]),
    (
        "Volume",
        &[
            ("name", Copy),
            ("configMap", Translate),
            ("csi", Check),
            ("downwardAPI", Translate),
            // Its sizeLimit capped, and given where unset (`resources.rs`).
            ("emptyDir", Check),
            ("ephemeral", Translate),
            ("hostPath", Check),
            // Its reference from a registry of `allow.imageRegistries` (`images.rs`); its pull
            // policy becomes Always, as a container's does.
            ("image", Check),
            ("persistentVolumeClaim", Translate),
            ("projected", Translate),
            ("secret", Translate),
            // Each of these names storage, or a Secret, outside the tenant's own objects.
            ("awsElasticBlockStore", Never { hint: PVC_HINT }),
            ("azureDisk", Never { hint: PVC_HINT }),
            ("azureFile", Never { hint: PVC_HINT }),
            ("cephfs", Never { hint: PVC_HINT }),
            ("cinder", Never { hint: PVC_HINT }),
            ("fc", Never { hint: PVC_HINT }),
            ("flexVolume", Never { hint: PVC_HINT }),
            ("flocker", Never { hint: PVC_HINT }),
            ("gcePersistentDisk", Never { hint: PVC_HINT }),
            ("gitRepo", Never { hint: PVC_HINT }),
            ("glusterfs", Never { hint: PVC_HINT }),
            ("iscsi", Never { hint: PVC_HINT }),
            ("nfs", Never { hint: PVC_HINT }),
            ("photonPersistentDisk", Never { hint: PVC_HINT }),
            ("portworxVolume", Never { hint: PVC_HINT }),
            ("quobyte", Never { hint: PVC_HINT }),
            ("rbd", Never { hint: PVC_HINT }),
            ("scaleIO", Never { hint: PVC_HINT }),
            ("storageos", Never { hint: PVC_HINT }),
            ("vsphereVolume", Never { hint: PVC_HINT }),
        ],
    ),
    (
        "ProjectedVolumeSource",
        &[("defaultMode", Copy), ("sources", Translate)],
    ),
    (
        "VolumeProjection",
        &[
            ("configMap", Translate),
            ("downwardAPI", Translate),
            ("secret", Translate),
            ("serviceAccountToken", Translate),
            // Reads the host's cluster-wide trust bundles.
            ("clusterTrustBundle", Never { hint: "" }),
            // The host's kubelet would ask the host's signers for a certificate in the pod's
            // name, on the platform's rights.
            ("podCertificate", Never { hint: "" }),
        ],
    ),
];

const CONTAINER: &[(&str, Decision)] = &[
    ("args", Copy),
    ("command", Copy),
    ("env", Translate),
    ("envFrom", Translate),
    // From a registry of `allow.imageRegistries` (`images.rs`): nodes pull with credentials of
    // their own.
    ("image", Check),
    // Always: an image cached on the node for someone else never runs without credentials.
    ("imagePullPolicy", Translate),
    ("lifecycle", Copy),
    ("livenessProbe", Copy),
    ("name", Copy),
    ("ports", Copy),
    ("readinessProbe", Copy),
    ("resizePolicy", Copy),
    // Each resource name decided, node disk capped (`resources.rs`), all counted by the quota;
    // `claims` (dynamic resource allocation) is refused.
    ("resources", Check),
    ("restartPolicy", Copy),
    // Restart on given exit codes: the kubelet's, inside the pod.
    ("restartPolicyRules", Copy),
    ("securityContext", Copy),
    ("startupProbe", Copy),
    ("stdin", Copy),
    ("stdinOnce", Copy),
    ("terminationMessagePath", Copy),
    ("terminationMessagePolicy", Copy),
    ("tty", Copy),
    ("volumeDevices", Copy),
    ("volumeMounts", Copy),
    ("workingDir", Copy),
];

const SCHEMA_PREFIX: &str = "io.k8s.api.core.v1.";

/// The decision on `field` of pod type `ty`, if there is one.
pub fn decision(ty: &str, field: &str) -> Option<Decision> {
    let find = |ty: &str| {
        FIELDS
            .iter()
            .find(|(t, _)| *t == ty)
            .and_then(|(_, fields)| fields.iter().find(|(f, _)| *f == field))
            .map(|(_, d)| *d)
    };
    find(ty).or_else(|| {
        (ty == "EphemeralContainer")
            .then(|| find("Container"))
            .flatten()
    })
}

fn decided(ty: &str) -> bool {
    FIELDS.iter().any(|(t, _)| *t == ty)
}

/// Each decided type's fields, with the decided type a field holds (directly or as a list), as
/// k8s-openapi's schema gives them: built once.
type Shapes = BTreeMap<String, BTreeMap<String, Option<String>>>;

static SHAPES: LazyLock<Shapes> = LazyLock::new(shapes);

fn shapes() -> Shapes {
    let root = schemars::SchemaGenerator::default().into_root_schema_for::<PodSpec>();
    let root = root.as_value();
    let mut out = Shapes::new();
    let fields = |schema: &Value| -> BTreeMap<String, Option<String>> {
        let Some(props) = schema.get("properties").and_then(Value::as_object) else {
            return BTreeMap::new();
        };
        props
            .iter()
            .map(|(name, p)| {
                let target = p
                    .get("$ref")
                    .or_else(|| p.get("items").and_then(|i| i.get("$ref")))
                    .and_then(Value::as_str)
                    .and_then(|r| r.rsplit('/').next())
                    .and_then(|t| t.strip_prefix(SCHEMA_PREFIX))
                    .map(str::to_string);
                (name.clone(), target)
            })
            .collect()
    };
    out.insert("PodSpec".into(), fields(root));
    for (name, schema) in root
        .get("$defs")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        if let Some(short) = name.strip_prefix(SCHEMA_PREFIX) {
            out.insert(short.to_string(), fields(schema));
        }
    }
    out
}

/// Is a field's value set: anything but null, false, zero, or empty?
fn set(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => false,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        Value::Bool(true) => true,
    }
}

/// Why a pod may not reach the host by the field table: fields refused whatever their value,
/// and fields without a decision. The value checks are `pod_refusals`'.
pub fn field_refusals(allow: &Allowances, spec: &PodSpec) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(value) = serde_json::to_value(spec) {
        walk(allow, &value, "PodSpec", "spec", &mut out);
    }
    out
}

fn walk(allow: &Allowances, value: &Value, ty: &str, path: &str, out: &mut Vec<String>) {
    let Some(obj) = value.as_object() else {
        return;
    };
    for (field, v) in obj {
        if !set(v) {
            continue;
        }
        let here = format!("{path}.{field}");
        match decision(ty, field) {
            None => out.push(format!(
                "{here} is not copied to the host: this version of the syncer has no decision about it"
            )),
            Some(Refuse { setting, open }) if !open(allow) => out.push(format!(
                "{here} is not allowed for tenant pods (the IsolationProfile's allow.{setting} is off)"
            )),
            Some(Never { hint }) => out.push(format!(
                "{here} is not allowed for tenant pods on this host{hint}"
            )),
            Some(_) => {}
        }
        let Some(child) = SHAPES
            .get(ty)
            .and_then(|f| f.get(field))
            .cloned()
            .flatten()
            .filter(|c| decided(c))
        else {
            continue;
        };
        match v {
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let name = item.get("name").and_then(Value::as_str);
                    let at = match name {
                        Some(n) => format!("{here}[{n:?}]"),
                        None => format!("{here}[{i}]"),
                    };
                    walk(allow, item, &child, &at, out);
                }
            }
            _ => walk(allow, v, &child, &here, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every field of every decided type, and of every pod type a decided field holds, has a
    /// decision; and the table names no field the schema lacks. A new Kubernetes field fails
    /// here until someone decides about it.
    #[test]
    fn every_field_of_the_pod_types_has_a_decision() {
        let shapes = &*SHAPES;
        let mut undecided = Vec::new();
        for (ty, fields) in FIELDS {
            let schema = shapes
                .get(*ty)
                .unwrap_or_else(|| panic!("{ty} is not a pod type of this k8s-openapi"));
            for field in schema.keys() {
                if decision(ty, field).is_none() {
                    undecided.push(format!("{ty}.{field}"));
                }
            }
            for (f, _) in *fields {
                assert!(
                    schema.contains_key(*f),
                    "{ty}.{f} is decided but not a field"
                );
            }
        }
        assert!(
            undecided.is_empty(),
            "fields without a decision: {undecided:?}"
        );
        for ty in [
            "PodSpec",
            "Container",
            "EphemeralContainer",
            "PodSecurityContext",
            "SecurityContext",
            "Probe",
            "Lifecycle",
            "Volume",
        ] {
            assert!(decided(ty), "{ty} must be decided field by field");
        }
    }

    #[test]
    fn refused_fields_name_their_path_and_the_setting_that_opens_them() {
        let spec: PodSpec = serde_json::from_value(json!({
            "containers": [{"name": "web", "securityContext": {
                "windowsOptions": {"gmsaCredentialSpecName": "domain-admin"},
                "seLinuxOptions": {"level": "s0:c0.c1023"}}}],
            "securityContext": {"windowsOptions": {"gmsaCredentialSpec": "{}"}},
            "volumes": [{"name": "share", "nfs": {"server": "filer", "path": "/"}},
                        {"name": "p", "projected": {"sources": [{"clusterTrustBundle": {"path": "b", "name": "n"}},
                                                                 {"podCertificate": {"signerName": "example.com/s", "keyType": "ED25519"}}]}}]
        }))
        .unwrap();
        let text = field_refusals(&Allowances::default(), &spec).join("\n");
        for needle in [
            "spec.containers[\"web\"].securityContext.windowsOptions.gmsaCredentialSpecName is not allowed for tenant pods (the IsolationProfile's allow.privileged is off)",
            "spec.securityContext.windowsOptions.gmsaCredentialSpec",
            "spec.containers[\"web\"].securityContext.seLinuxOptions.level",
            "spec.volumes[\"share\"].nfs is not allowed for tenant pods on this host; use a PersistentVolumeClaim",
            "spec.volumes[\"p\"].projected.sources[0].clusterTrustBundle",
            "spec.volumes[\"p\"].projected.sources[1].podCertificate is not allowed for tenant pods on this host",
        ] {
            assert!(text.contains(needle), "{needle} missing from:\n{text}");
        }
        let opened = Allowances {
            privileged: true,
            ..Default::default()
        };
        let left = field_refusals(&opened, &spec).join("\n");
        assert!(
            !left.contains("gmsa") && !left.contains("level") && left.contains("nfs"),
            "{left}"
        );
        let plain: PodSpec = serde_json::from_value(json!({
            "containers": [{"name": "c", "image": "nginx", "ports": [{"containerPort": 80}],
                            "securityContext": {"windowsOptions": {"hostProcess": false}}}],
            "hostNetwork": false
        }))
        .unwrap();
        assert!(field_refusals(&Allowances::default(), &plain).is_empty());
    }
}
