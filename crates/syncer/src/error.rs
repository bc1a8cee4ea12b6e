//! Why one object failed to sync. Each variant is a category: it names the `Synced` reason, the
//! `reason` label of `tenantplane_sync_errors_total`, and how soon the key is tried again.

use std::time::Duration;

/// A failure while converging one key.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The host API refused the copy (admission, validation, quota).
    #[error("the host refused it: {0}")]
    HostRejected(String),
    /// The tenant's IsolationProfile does not allow what the object asks of the host.
    #[error("not allowed on the host: {0}")]
    NotAllowed(String),
    /// A host object of the copy's name exists that the syncer did not make.
    #[error(
        "a host {kind} named {name} exists that the syncer did not create; rename or delete it"
    )]
    HostNameTaken {
        /// The kind of the host object.
        kind: String,
        /// Its name on the host: the name the copy would take.
        name: String,
    },
    /// The tenant refused the cluster IP of the host copy of a Service.
    #[error(
        "the tenant refused the cluster IP {ip} ({message}); is the tenant's service CIDR the host's?"
    )]
    ServiceIpNotAdopted {
        /// The host copy's cluster IP.
        ip: String,
        /// Why the tenant API server refused it.
        message: String,
    },
    /// The tenant API minted no token for a service account.
    #[error("the tenant API returned no token for ServiceAccount {0}")]
    TokenRequestFailed(String),
    /// An object could not be turned into JSON (a bug, not the user's).
    #[error("serializing {kind}: {source}")]
    Serialize {
        /// The kind being serialized.
        kind: String,
        /// What serde said.
        source: serde_json::Error,
    },
    /// Any other API error: usually passing (a conflict, a timeout), so retried soon.
    #[error("{0}")]
    Api(#[from] kube::Error),
}

impl Error {
    /// CamelCase, for the `Synced` condition and the metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::HostRejected(_) => "HostRejected",
            Error::NotAllowed(_) => "NotAllowed",
            Error::HostNameTaken { .. } => "HostNameTaken",
            Error::ServiceIpNotAdopted { .. } => "ServiceIPNotAdopted",
            Error::TokenRequestFailed(_) => "TokenRequestFailed",
            Error::Serialize { .. } | Error::Api(_) => "SyncFailed",
        }
    }

    /// Is this a verdict on the object that only a change of the object or of the profile (which
    /// restarts the syncer) can undo? Such a key is not retried on a clock.
    pub fn waits_for_change(&self) -> bool {
        matches!(self, Error::NotAllowed(_))
    }

    /// The first delay of the key's back-off. A refusal does not go away by itself: it is looked
    /// at again slowly (or as soon as the tenant object changes); anything else soon.
    pub fn first_retry(&self) -> Duration {
        self.first_retry_in(&crate::Retries::default())
    }

    /// The first retry under `retries`: a refusal waits [`Retries::refused_first`]
    /// (crate::Retries), anything else a quarter second.
    pub fn first_retry_in(&self, retries: &crate::Retries) -> Duration {
        match self {
            Error::HostRejected(_)
            | Error::NotAllowed(_)
            | Error::HostNameTaken { .. }
            | Error::ServiceIpNotAdopted { .. } => retries.refused_first,
            _ => Duration::from_millis(250),
        }
    }
}

impl From<crate::converge::Error> for Error {
    fn from(e: crate::converge::Error) -> Self {
        match e {
            crate::converge::Error::Api(e) => Error::Api(e),
            crate::converge::Error::Serialize { kind, source } => Error::Serialize { kind, source },
            crate::converge::Error::NameTaken { kind, name } => Error::HostNameTaken { kind, name },
        }
    }
}

impl Error {
    /// A failure writing a host copy: the host's refusal is named as such.
    pub fn on_host(e: crate::converge::Error) -> Self {
        match e {
            crate::converge::Error::Api(e) => Error::from_api(e),
            other => other.into(),
        }
    }

    /// An API error writing a host copy: a refusal (403 Forbidden by admission or quota, 422
    /// Invalid) is the host's verdict on the object; anything else passes.
    pub fn from_api(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(r) if r.code == 403 || r.code == 422 => Error::HostRejected(r.message),
            other => Error::Api(other),
        }
    }
}

/// The syncer's results, failing with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error and its causes as a log line says them, outermost first, joined by `: `: kube's API
/// errors as the API server's message, reason and code (their `Display` ends in a Rust debug dump
/// of the `Status`), also where a wrapper prints such a cause inside its own text, and a cause the
/// text before already says left out. The same as `tenantplane_client::error_chain`, which the
/// syncer does not depend on.
pub fn log_text(error: &(dyn std::error::Error + 'static)) -> String {
    fn status(s: &kube::core::Status) -> String {
        format!("{} ({}, {})", s.message, s.reason, s.code)
    }
    fn clean(e: &(dyn std::error::Error + 'static)) -> Option<String> {
        match e.downcast_ref::<kube::Error>() {
            Some(kube::Error::Api(s)) => Some(status(s)),
            Some(other) => Some(other.to_string()),
            None => e
                .downcast_ref::<Box<kube::core::Status>>()
                .map(|s| status(s))
                .or_else(|| e.downcast_ref::<kube::core::Status>().map(status)),
        }
    }
    let links: Vec<&(dyn std::error::Error + 'static)> =
        std::iter::successors(Some(error), |e| e.source()).collect();
    let mut parts: Vec<String> = Vec::new();
    for (i, link) in links.iter().enumerate() {
        let text = clean(*link).unwrap_or_else(|| {
            links[i + 1..]
                .iter()
                .fold(link.to_string(), |text, cause| match clean(*cause) {
                    Some(said) => text.replace(&cause.to_string(), &said),
                    None => text,
                })
        });
        if !text.is_empty() && !parts.iter().any(|said| said.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_wait_longer_than_passing_errors() {
        let refused = Error::HostRejected("pods \"x\" is forbidden".into());
        assert_eq!(refused.reason(), "HostRejected");
        assert_eq!(
            refused.to_string(),
            "the host refused it: pods \"x\" is forbidden"
        );
        let taken = Error::HostNameTaken {
            kind: "ConfigMap".into(),
            name: "a-x-b-x-c".into(),
        };
        assert!(taken.first_retry() > Duration::from_secs(1));
        let passing = Error::TokenRequestFailed("default/default".into());
        assert!(passing.first_retry() < Duration::from_secs(1));
    }

    #[test]
    fn log_text_says_the_api_servers_words_without_a_debug_dump() {
        let not_found = || {
            kube::Error::Api(Box::new(
                kube::core::Status::failure(r#"pods "web" not found"#, "NotFound").with_code(404),
            ))
        };
        let want = r#"pods "web" not found (NotFound, 404)"#;
        // The syncer's own error, whose text is its kube cause's (debug dump and all).
        let e = Error::Api(not_found());
        assert!(e.to_string().contains("Status {"), "{e}");
        assert_eq!(log_text(&e), want);
        // A wrapper that prints its cause inside its own text, as a watch's error does.
        let e = kube::runtime::watcher::Error::InitialListFailed(not_found());
        assert_eq!(
            log_text(&e),
            format!("failed to perform initial object list: {want}")
        );
        // Errors without a kube cause read as their Display.
        let e = Error::NotAllowed("hostPort 80".into());
        assert_eq!(log_text(&e), "not allowed on the host: hostPort 80");
    }
}
