//! The table of removed API versions, as data: one row per group/version, release and
//! replacement.

use super::Removal;

/// Shorthand for the rows of [`REMOVALS`]; every removal is in a 1.x release.
const fn removed(
    minor: u32,
    group_version: &'static str,
    kinds: &'static [&'static str],
    replacement: &'static str,
) -> Removal {
    Removal {
        group_version,
        kinds,
        removed_in: (1, minor),
        replacement,
    }
}

/// Built-in API versions removed per release, v1.16 – v1.37, one row per
/// (group/version, release, replacement); no (group/version, kind) pair appears twice.
///
/// Sources:
///
/// * v1.16 – v1.32: the Kubernetes "Deprecated API Migration Guide",
///   <https://kubernetes.io/docs/reference/using-api/deprecation-guide/>. Its newest section
///   is v1.32; the releases in between without a section removed nothing it lists.
/// * v1.33 – v1.37 (not in the guide): the kube-apiserver's own code. It stops serving a
///   built-in prerelease type once the type's generated `APILifecycleRemoved()` version
///   (`k8s.io/api/**/zz_generated.prerelease-lifecycle.go`, read at k8s.io/api v0.33.0 …
///   v0.37.0-beta.0) is reached (`ShouldServeForVersion` in k8s.io/apiserver
///   `pkg/server/deleted_kinds.go`); alpha versions whose Go types were deleted between
///   tags are gone as well. The beta rows among these were off by default (KEP-3136) and
///   alpha rows always are, so they only matter where `--runtime-config` enabled them.
///
/// In the release named by `removed_in` itself the apiserver still serves the version on
/// alpha pre-release builds, with `KUBE_APISERVER_SERVE_REMOVED_APIS_FOR_ONE_RELEASE=true`,
/// or while `--emulated-version` is older; the table records the nominal release.
pub const REMOVALS: &[Removal] = &[
    // v1.16 (guide)
    removed(
        16,
        "extensions/v1beta1",
        &["NetworkPolicy"],
        "networking.k8s.io/v1",
    ),
    removed(
        16,
        "extensions/v1beta1",
        &["DaemonSet", "Deployment", "ReplicaSet"],
        "apps/v1",
    ),
    // The guide names policy/v1beta1, which was itself removed in v1.25.
    removed(
        16,
        "extensions/v1beta1",
        &["PodSecurityPolicy"],
        "Pod Security Admission or a third-party admission webhook",
    ),
    removed(
        16,
        "apps/v1beta1",
        &["Deployment", "StatefulSet", "ReplicaSet"],
        "apps/v1",
    ),
    removed(
        16,
        "apps/v1beta2",
        &["DaemonSet", "Deployment", "StatefulSet", "ReplicaSet"],
        "apps/v1",
    ),
    // v1.22 (guide)
    removed(
        22,
        "admissionregistration.k8s.io/v1beta1",
        &[
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ],
        "admissionregistration.k8s.io/v1",
    ),
    removed(
        22,
        "apiextensions.k8s.io/v1beta1",
        &["CustomResourceDefinition"],
        "apiextensions.k8s.io/v1",
    ),
    removed(
        22,
        "apiregistration.k8s.io/v1beta1",
        &["APIService"],
        "apiregistration.k8s.io/v1",
    ),
    removed(
        22,
        "authentication.k8s.io/v1beta1",
        &["TokenReview"],
        "authentication.k8s.io/v1",
    ),
    removed(
        22,
        "authorization.k8s.io/v1beta1",
        &[
            "LocalSubjectAccessReview",
            "SelfSubjectAccessReview",
            "SubjectAccessReview",
            "SelfSubjectRulesReview",
        ],
        "authorization.k8s.io/v1",
    ),
    removed(
        22,
        "certificates.k8s.io/v1beta1",
        &["CertificateSigningRequest"],
        "certificates.k8s.io/v1",
    ),
    removed(
        22,
        "coordination.k8s.io/v1beta1",
        &["Lease"],
        "coordination.k8s.io/v1",
    ),
    removed(
        22,
        "extensions/v1beta1",
        &["Ingress"],
        "networking.k8s.io/v1",
    ),
    removed(
        22,
        "networking.k8s.io/v1beta1",
        &["Ingress", "IngressClass"],
        "networking.k8s.io/v1",
    ),
    removed(
        22,
        "rbac.authorization.k8s.io/v1beta1",
        &["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"],
        "rbac.authorization.k8s.io/v1",
    ),
    removed(
        22,
        "scheduling.k8s.io/v1beta1",
        &["PriorityClass"],
        "scheduling.k8s.io/v1",
    ),
    removed(
        22,
        "storage.k8s.io/v1beta1",
        &["CSIDriver", "CSINode", "StorageClass", "VolumeAttachment"],
        "storage.k8s.io/v1",
    ),
    // v1.25 (guide)
    removed(25, "batch/v1beta1", &["CronJob"], "batch/v1"),
    removed(
        25,
        "discovery.k8s.io/v1beta1",
        &["EndpointSlice"],
        "discovery.k8s.io/v1",
    ),
    removed(25, "events.k8s.io/v1beta1", &["Event"], "events.k8s.io/v1"),
    removed(
        25,
        "autoscaling/v2beta1",
        &["HorizontalPodAutoscaler"],
        "autoscaling/v2",
    ),
    removed(25, "policy/v1beta1", &["PodDisruptionBudget"], "policy/v1"),
    removed(
        25,
        "policy/v1beta1",
        &["PodSecurityPolicy"],
        "Pod Security Admission or a third-party admission webhook",
    ),
    removed(
        25,
        "node.k8s.io/v1beta1",
        &["RuntimeClass"],
        "node.k8s.io/v1",
    ),
    // v1.26 (guide). For flowcontrol the guide names v1beta2, itself removed in v1.29.
    removed(
        26,
        "flowcontrol.apiserver.k8s.io/v1beta1",
        &["FlowSchema", "PriorityLevelConfiguration"],
        "flowcontrol.apiserver.k8s.io/v1beta3, then v1 from v1.29",
    ),
    removed(
        26,
        "autoscaling/v2beta2",
        &["HorizontalPodAutoscaler"],
        "autoscaling/v2",
    ),
    // v1.27 (guide)
    removed(
        27,
        "storage.k8s.io/v1beta1",
        &["CSIStorageCapacity"],
        "storage.k8s.io/v1",
    ),
    // v1.29 (guide)
    removed(
        29,
        "flowcontrol.apiserver.k8s.io/v1beta2",
        &["FlowSchema", "PriorityLevelConfiguration"],
        "flowcontrol.apiserver.k8s.io/v1",
    ),
    // v1.32 (guide)
    removed(
        32,
        "flowcontrol.apiserver.k8s.io/v1beta3",
        &["FlowSchema", "PriorityLevelConfiguration"],
        "flowcontrol.apiserver.k8s.io/v1",
    ),
    // v1.33 (apiserver code; not in the guide)
    removed(
        33,
        "authentication.k8s.io/v1beta1",
        &["SelfSubjectReview"],
        "authentication.k8s.io/v1",
    ),
    removed(
        33,
        "networking.k8s.io/v1alpha1",
        &["IPAddress", "ServiceCIDR"],
        "networking.k8s.io/v1",
    ),
    // v1.34 (apiserver code; not in the guide)
    removed(
        34,
        "admissionregistration.k8s.io/v1beta1",
        &[
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ],
        "admissionregistration.k8s.io/v1",
    ),
    removed(
        34,
        "resource.k8s.io/v1alpha3",
        &[
            "DeviceClass",
            "ResourceClaim",
            "ResourceClaimTemplate",
            "ResourceSlice",
        ],
        "resource.k8s.io/v1",
    ),
    // v1.35 (apiserver code; not in the guide)
    removed(
        35,
        "storage.k8s.io/v1alpha1",
        &["VolumeAttributesClass"],
        "storage.k8s.io/v1",
    ),
    removed(
        35,
        "storagemigration.k8s.io/v1alpha1",
        &["StorageVersionMigration"],
        "storagemigration.k8s.io/v1beta1",
    ),
    removed(
        35,
        "certificates.k8s.io/v1alpha1",
        &["PodCertificateRequest"],
        "certificates.k8s.io/v1beta1",
    ),
    // v1.36 (apiserver code; not in the guide)
    removed(
        36,
        "scheduling.k8s.io/v1alpha1",
        &["Workload"],
        "scheduling.k8s.io/v1alpha2, then v1alpha3 from v1.37",
    ),
    // v1.37 (apiserver code; not in the guide)
    removed(
        37,
        "networking.k8s.io/v1beta1",
        &["IPAddress", "ServiceCIDR"],
        "networking.k8s.io/v1",
    ),
    removed(
        37,
        "storage.k8s.io/v1beta1",
        &["VolumeAttributesClass"],
        "storage.k8s.io/v1",
    ),
    removed(
        37,
        "certificates.k8s.io/v1alpha1",
        &["ClusterTrustBundle"],
        "certificates.k8s.io/v1",
    ),
    removed(
        37,
        "scheduling.k8s.io/v1alpha2",
        &["Workload", "PodGroup"],
        "scheduling.k8s.io/v1alpha3",
    ),
];
