//! The CEL admission rules of our resources, one function each, so the derive attributes stay
//! readable and the messages are written once. Every message tells a person what to change.

use kube::core::{Message, Reason, Rule};

const VERSION: &str = r"^v[0-9]+\\.[0-9]+\\.[0-9]+$";

fn rule(expr: impl Into<String>, message_expression: impl Into<String>) -> Rule {
    Rule::new(expr).message(Message::Expression(message_expression.into()))
}

/// `int` of part `i` (0 major, 1 minor, 2 patch) of a version string held in CEL variable `var`.
fn part(var: &str, i: usize) -> String {
    format!("int({var}.substring(1).split('.')[{i}])")
}

/// Both sides are well-formed versions; otherwise the format rule speaks and this one stays quiet.
fn both_versions_valid() -> String {
    format!("self.matches('{VERSION}') && oldSelf.matches('{VERSION}')")
}

/// The version looks like `v1.30.4`: a v, then major.minor.patch.
pub fn version_format() -> Rule {
    rule(
        format!("self.matches('{VERSION}')"),
        "'kubernetesVersion must look like v1.30.4 (a v, then major.minor.patch); got ' + self",
    )
}

/// The oldest Kubernetes version a tenant runs.
pub const OLDEST_VERSION: &str = "v1.30.0";

/// The newest minor version a tenant runs: the newest whose k3s releases
/// (`build::k3s::releases`) and removed APIs (the upgrade guard's table) this operator knows.
pub const NEWEST_MINOR: &str = "v1.36";

/// The version is one a tenant runs: from [`OLDEST_VERSION`] to [`NEWEST_MINOR`]; the message
/// names the bound that was crossed.
pub fn version_supported() -> Rule {
    let (n0, n1) = (part("self", 0), part("self", 1));
    let (oldest, newest) = (minor_of(OLDEST_VERSION), minor_of(NEWEST_MINOR));
    rule(
        format!(
            "!self.matches('{VERSION}') || ({n0} == 1 && {n1} >= {oldest} && {n1} <= {newest})"
        ),
        format!(
            "({n0} > 1 || ({n0} == 1 && {n1} > {newest})) ? 'kubernetesVersion ' + self + ' is newer than any a tenant runs: the newest is {NEWEST_MINOR} (the newest minor whose k3s releases and removed APIs this operator knows); use a {NEWEST_MINOR} release such as {NEWEST_MINOR}.3, or an operator that knows newer ones' : 'kubernetesVersion ' + self + ' is not one a tenant runs: the oldest is {OLDEST_VERSION} (older k3s lacks flags its control plane uses, such as --egress-selector-mode); use {OLDEST_VERSION} or newer'"
        ),
    )
}

/// The minor of `v1.30` or `v1.30.0`, for a rule: `30`.
fn minor_of(version: &str) -> &str {
    version.split('.').nth(1).unwrap_or("0")
}

/// An image reference: no spaces, no scheme.
pub fn image_reference(field: &str) -> Rule {
    rule(
        r"self.matches('^[a-zA-Z0-9][a-zA-Z0-9._/:@-]*$')",
        format!(
            "'{field} must be an image reference such as registry.example/k3s:v1.30.14-k3s2 (letters, digits and . _ / : @ -); got ' + self"
        ),
    )
}

/// The version never goes down, but in the change that also asks a new restore: a rollback puts
/// back the snapshot taken before the upgrade together with the version it ran (the operator
/// refuses a snapshot newer than the version).
pub fn version_no_downgrade() -> Rule {
    let (new, old) = ("self.kubernetesVersion", "oldSelf.kubernetesVersion");
    let (n0, n1, n2) = (part(new, 0), part(new, 1), part(new, 2));
    let (o0, o1, o2) = (part(old, 0), part(old, 1), part(old, 2));
    let valid = format!("{new}.matches('{VERSION}') && {old}.matches('{VERSION}')");
    let restores =
        "(has(self.restore) && (!has(oldSelf.restore) || self.restore != oldSelf.restore))";
    rule(
        format!(
            "!({valid}) || {restores} || {n0} > {o0} || ({n0} == {o0} && ({n1} > {o1} || ({n1} == {o1} && {n2} >= {o2})))"
        ),
        format!(
            "'kubernetesVersion cannot be downgraded: ' + {old} + ' to ' + {new} + ' is refused; keep ' + {old} + ' or move up (to go back, restore a snapshot taken at the old version: tenantplane rollback)'"
        ),
    )
    .reason(Reason::FieldValueForbidden)
    .field_path(".kubernetesVersion")
}

/// The version moves up one minor version at a time, never skipping one.
pub fn version_one_minor_at_a_time() -> Rule {
    let (n0, n1) = (part("self", 0), part("self", 1));
    let (o0, o1) = (part("oldSelf", 0), part("oldSelf", 1));
    rule(
        format!(
            "!({valid}) || {n0} < {o0} || ({n0} == {o0} && {n1} <= {o1} + 1)",
            valid = both_versions_valid()
        ),
        "'kubernetesVersion moves up one minor version at a time: ' + oldSelf + ' to ' + self + ' skips a minor version; upgrade to the next minor version first'",
    )
    .reason(Reason::FieldValueForbidden)
}

/// The tenant's name becomes a Service and StatefulSet name (pods add `-0` and a revision
/// label): a DNS label of at most 52 characters that starts with a letter.
pub fn tenant_name() -> Rule {
    Rule::new("self.metadata.name.size() <= 52 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')")
        .message("a TenantCluster name must be at most 52 characters of lowercase letters, digits and -, starting with a letter (it names the tenant's Service and StatefulSet)")
}

/// `spec.mode` changes only with `spec.migration.allowModeChange`.
pub fn mode_change_allowed() -> Rule {
    rule(
        "self.mode == oldSelf.mode || (has(self.migration) && has(self.migration.allowModeChange) && self.migration.allowModeChange)",
        "'changing spec.mode from ' + oldSelf.mode + ' to ' + self.mode + ' needs spec.migration.allowModeChange: true'",
    )
    .reason(Reason::FieldValueForbidden)
    .field_path(".mode")
}

/// The distribution, as a rule reads it: absent is the default (`k3s`).
fn distribution(of: &str) -> String {
    format!(
        "(has({of}.controlPlane) && has({of}.controlPlane.distribution) ? {of}.controlPlane.distribution : 'k3s')"
    )
}

/// `spec.controlPlane.distribution` changes only with `spec.migration.allowModeChange`.
pub fn distribution_change_allowed() -> Rule {
    let (new, old) = (distribution("self"), distribution("oldSelf"));
    rule(
        format!(
            "{new} == {old} || (has(self.migration) && has(self.migration.allowModeChange) && self.migration.allowModeChange)"
        ),
        format!(
            "'changing spec.controlPlane.distribution from ' + {old} + ' to ' + {new} + ' needs spec.migration.allowModeChange: true (the data is kept: both run kine over sqlite on the same claim)'"
        ),
    )
    .reason(Reason::FieldValueForbidden)
    .field_path(".controlPlane.distribution")
}

/// Kubernetes releases k3s never built, each with the first k3s release after it. k3s's first 1.34
/// was v1.34.1 (its release notes and k3s-io/k3s-upgrade's tags have no v1.34.0).
pub const K3S_NEVER_SHIPPED: &[(&str, &str)] = &[("v1.34.0", "v1.34.1")];

/// A k3s tenant at a version k3s never shipped has no image to run, unless it pins its own.
pub fn k3s_shipped_the_version() -> Rule {
    let unpinned_k3s = format!(
        "{} == 'k3s' && !(has(self.controlPlane) && has(self.controlPlane.image))",
        distribution("self")
    );
    let never = K3S_NEVER_SHIPPED
        .iter()
        .map(|(v, _)| format!("'{v}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let next = K3S_NEVER_SHIPPED
        .iter()
        .fold("''".to_string(), |rest, (v, first)| {
            format!("(self.kubernetesVersion == '{v}' ? '{first}' : {rest})")
        });
    rule(
        format!("!({unpinned_k3s}) || !(self.kubernetesVersion in [{never}])"),
        format!(
            "'k3s shipped no ' + self.kubernetesVersion + ', so a k3s tenant has no image to run: use ' + {next} + ', or distribution kubernetes, or pin spec.controlPlane.image'"
        ),
    )
    .field_path(".kubernetesVersion")
}

/// `controlPlane.image` names a k3s image, so only the k3s distribution may set it.
pub fn image_only_for_k3s() -> Rule {
    Rule::new("!has(self.image) || !has(self.distribution) || self.distribution == 'k3s'")
        .message("controlPlane.image names a k3s image and is only for distribution k3s; the kubernetes distribution runs the operator's kine, kube-apiserver and kube-controller-manager images: remove controlPlane.image")
        .field_path(".image")
}

// Messages that would print a number or a list are static: the API server's cost estimate of
// `string(int)` and `join` is unbounded, and it refuses the CRD.

/// The sqlite datastore runs a single replica.
pub fn sqlite_single_replica() -> Rule {
    Rule::new("self.datastore.type != 'sqlite' || self.replicas <= 1")
        .message("the sqlite datastore runs a single replica: set controlPlane.replicas to 1")
        .field_path(".replicas")
}

/// An integer `field` of at least 1.
pub fn at_least_one(field: &str) -> Rule {
    Rule::new("self >= 1").message(format!("{field} must be at least 1").as_str())
}

/// A quantity above zero; `example` shows one in the message.
pub fn positive_quantity(field: &str, example: &str) -> Rule {
    rule(
        "isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))",
        format!("'{field} must be a positive quantity such as {example}; got ' + self"),
    )
}

/// A quantity of at least `min` (`why`: what needs it), such as a storage cap that must hold the
/// control plane's claim.
pub fn quantity_at_least(field: &str, min: &str, why: &str) -> Rule {
    rule(
        format!("isQuantity(self) && quantity(self).compareTo(quantity('{min}')) >= 0"),
        format!("'{field} must be a quantity of at least {min} ({why}); got ' + self"),
    )
}

/// A value of a quantity map (ResourceQuota `hard`, LimitRange defaults); the API server's error
/// path names the key.
pub fn quantity() -> Rule {
    rule(
        "isQuantity(self)",
        "'must be a quantity such as 10, 500m or 1Gi; got ' + self",
    )
}

/// The names of `allow.resources`: resources of their own, not those other fields decide.
pub fn extra_resource_names() -> Rule {
    rule(
        "self.all(k, !(k in ['cpu', 'memory', 'ephemeral-storage', 'storage', 'pods']))",
        "'allow.resources lists resources beyond cpu, memory and ephemeral-storage (such as example.com/gpu or hugepages-2Mi); cpu and memory are capped by each TenantCluster resources field, node disk by allow.ephemeralStorage'",
    )
}

/// The kinds of `allow.maxObjectBytes`: those the syncer writes on the host.
pub fn object_bytes_kinds() -> Rule {
    rule(
        "self.all(k, k in ['Pod', 'Service', 'ConfigMap', 'Secret', 'Endpoints', 'EndpointSlice', 'Ingress', 'PersistentVolumeClaim', 'ServiceAccount'])",
        "'allow.maxObjectBytes is keyed by the kinds the syncer copies: Pod, Service, ConfigMap, Secret, Endpoints, EndpointSlice, Ingress, PersistentVolumeClaim, ServiceAccount'",
    )
}

/// A duration in Go's format, as CEL's `duration()` reads it: numbers with units h, m, s or ms.
pub fn go_duration(field: &str) -> Rule {
    rule(
        r"self.matches('^([0-9]+(\\.[0-9]+)?(h|m|s|ms))+$')",
        format!(
            "'{field} must be a duration such as 30m, 2h or 1h30m (units h, m, s); got ' + self"
        ),
    )
}

/// A duration of at least `min`; a malformed one is left to [`go_duration`]'s message.
pub fn duration_at_least(field: &str, min: &str) -> Rule {
    rule(
        format!(
            r"!self.matches('^([0-9]+(\\.[0-9]+)?(h|m|s|ms))+$') || duration(self) >= duration('{min}')"
        ),
        format!("'{field} must be at least {min}; got ' + self"),
    )
}

/// Every entry of the list `field` is a CIDR.
pub fn cidrs(field: &str) -> Rule {
    Rule::new("self.all(c, isCIDR(c))").message(
        format!("{field} must hold only CIDRs, such as 10.0.0.0/8 or 203.0.113.7/32").as_str(),
    )
}

/// A valid object name (lowercase letters, digits, `-` and `.`); `what` names it in the message.
pub fn object_name(what: &str) -> Rule {
    rule(
        r"self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",
        format!(
            "'{what} ' + self + ' is not a valid object name: use lowercase letters, digits, - and .'"
        ),
    )
}

/// A LimitRange default request may not exceed the default limit of the same resource.
pub fn request_within_limit() -> Rule {
    Rule::new(
        "!has(self.defaultRequest) || !has(self.default) || self.defaultRequest.all(k, !(k in self.default) || !isQuantity(self.defaultRequest[k]) || !isQuantity(self.default[k]) || quantity(self.defaultRequest[k]).compareTo(quantity(self.default[k])) <= 0)",
    )
    .message("limitRange.defaultRequest must not exceed limitRange.default for the same resource")
}

/// A default that fits under its cap (`allow.ephemeralStorage`): a default above it would give
/// every pod that sets no size a size the syncer then refuses.
pub fn default_within_cap(default: &str, cap: &str) -> Rule {
    let (d, c) = (format!("self.{default}"), format!("self.{cap}"));
    rule(
        format!(
            "!isQuantity({d}) || !isQuantity({c}) || quantity({d}).compareTo(quantity({c})) <= 0"
        ),
        format!(
            "'allow.ephemeralStorage.{default} (' + {d} + ') must not exceed allow.ephemeralStorage.{cap} (' + {c} + '): lower {default} too, or raise {cap}'"
        ),
    )
}

/// The rule behind every string enum: the value is one of `allowed`.
pub fn one_of(field: &str, allowed: &[&str]) -> Rule {
    let list = allowed
        .iter()
        .map(|v| format!("'{v}'"))
        .collect::<Vec<_>>()
        .join(", ");
    rule(
        format!("self in [{list}]"),
        format!(
            "'{field} must be one of {}; got ' + self",
            allowed.join(", ")
        ),
    )
    .reason(Reason::FieldValueInvalid)
}

/// A URL with an http or https scheme and a host.
pub fn http_url(field: &str) -> Rule {
    rule(
        r"self.matches('^https?://[^/?#\\s]+(/[^\\s]*)?$')",
        format!(
            "'{field} must be an http:// or https:// URL such as https://s3.example.com; got ' + self"
        ),
    )
}

/// An object (or part) that never changes once created.
pub fn immutable(what: &str) -> Rule {
    Rule::new("self == oldSelf")
        .message(format!("{what} is immutable: create a new object instead").as_str())
}

/// A cron schedule's shape: five fields (six, with seconds first), or one of the `@` names. The operator parses it and says
/// in status what it could not read.
pub fn cron_shape(field: &str) -> Rule {
    rule(
        r"self.matches('^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|\\S+(\\s+\\S+){4,5})$')",
        format!(
            "'{field} must be a cron schedule of five fields (minute hour day-of-month month day-of-week; six with seconds first), such as 0 3 * * *, or @daily / @hourly; got ' + self"
        ),
    )
}
