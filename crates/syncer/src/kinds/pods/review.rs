//! What of a tenant pod its host copy leaves out, and why a pod may have none: the placement
//! the profile allows, and the review the syncer tells the tenant about (see [`crate::allow`]).
//! What comes back up is `status`'s.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeAffinity, Pod, PodSpec};

use crate::allow;
use crate::tell::Review;
use crate::translate::Translator;

/// The tenant's placement as far as the profile allows it (what is left out, said by
/// [`review`]), then the profile's own node selector and tolerations.
pub(crate) fn placement(tr: &Translator, spec: &mut PodSpec) {
    let mut selector =
        allow::node_selector(&tr.allow, &spec.node_selector.take().unwrap_or_default()).0;
    selector.extend(tr.node_selector.clone());
    spec.node_selector = (!selector.is_empty()).then_some(selector);
    let mut tolerations =
        allow::tolerations(&tr.allow, &spec.tolerations.take().unwrap_or_default()).0;
    for t in &tr.tolerations {
        if !tolerations.contains(t) {
            tolerations.push(t.clone());
        }
    }
    spec.tolerations = (!tolerations.is_empty()).then_some(tolerations);
    node_affinity(
        tr,
        spec.affinity
            .as_mut()
            .and_then(|a| a.node_affinity.as_mut()),
    );
}

/// A pod's node affinity without terms on node labels the profile does not allow; what is left
/// out, said.
fn node_affinity(tr: &Translator, na: Option<&mut NodeAffinity>) -> Vec<String> {
    let mut dropped = Vec::new();
    let Some(na) = na else {
        return dropped;
    };
    let empty = |t: &k8s_openapi::api::core::v1::NodeSelectorTerm| {
        t.match_expressions.as_ref().is_none_or(|e| e.is_empty())
            && t.match_fields.as_ref().is_none_or(|f| f.is_empty())
    };
    if let Some(required) = na
        .required_during_scheduling_ignored_during_execution
        .as_mut()
    {
        for term in &mut required.node_selector_terms {
            dropped.extend(allow::node_term(&tr.allow, term));
        }
        // An empty term matches no node: one that lost every expression goes.
        required.node_selector_terms.retain(|t| !empty(t));
        if required.node_selector_terms.is_empty() {
            na.required_during_scheduling_ignored_during_execution = None;
        }
    }
    if let Some(preferred) = na
        .preferred_during_scheduling_ignored_during_execution
        .as_mut()
    {
        for p in preferred.iter_mut() {
            dropped.extend(allow::node_term(&tr.allow, &mut p.preference));
        }
        preferred.retain(|p| !empty(&p.preference));
    }
    dropped
}

/// Why a pod's `setHostnameAsFQDN` does not reach its copy.
pub const SET_HOSTNAME_AS_FQDN: &str = "setHostnameAsFQDN is left out of the host copy: the host would make the hostname a full name of the host's (its namespace and the copy's name); the pod's hostname is its short name, and its full name resolves from its hosts file";

/// What the host copy of `pod` leaves out and why it may have none (see [`crate::allow`]).
pub fn review(tr: &Translator, pod: &Pod) -> Review {
    let Some(spec) = pod.spec.as_ref() else {
        return Review::default();
    };
    let mut dropped = tr.annotations("Pod", &pod.metadata).1;
    dropped.extend(
        allow::node_selector(
            &tr.allow,
            spec.node_selector.as_ref().unwrap_or(&BTreeMap::new()),
        )
        .1,
    );
    dropped
        .extend(allow::tolerations(&tr.allow, spec.tolerations.as_deref().unwrap_or_default()).1);
    dropped.extend(allow::priority_class(&tr.allow, spec.priority_class_name.as_deref()).1);
    if spec.set_hostname_as_fqdn == Some(true) {
        dropped.push(SET_HOSTNAME_AS_FQDN.into());
    }
    let mut na = spec.affinity.as_ref().and_then(|a| a.node_affinity.clone());
    dropped.extend(node_affinity(tr, na.as_mut()));
    let mut copy = spec.clone();
    dropped.extend(allow::topology(&tr.allow, &mut copy));
    dropped.extend(allow::bound_durations(&tr.allow.durations, &mut copy));
    let mut refused = allow::pod_refusals(&tr.allow, spec);
    refused.extend(allow::default_limit_refusals(&tr.default_limits, spec));
    let tokens = super::tokens::token_sources(pod).len();
    if tokens > MAX_TOKENS {
        refused.push(format!(
            "the pod projects {tokens} service account tokens; at most {MAX_TOKENS} reach the host (the syncer mints each and keeps it in a host Secret of the pod's)"
        ));
    }
    Review { refused, dropped }
}

/// The most service-account tokens one pod may project: the host Secret that holds them grows
/// by about 1 KiB a token, and real pods project one or two.
pub const MAX_TOKENS: usize = 16;
