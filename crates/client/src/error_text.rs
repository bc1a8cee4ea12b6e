//! Errors as a person reads them. kube's `Error::Api` prints the API server's `Status` as a Rust
//! debug dump (`ApiError: … (Status { status: Some(Failure), … })`); every line a person reads,
//! the operator's conditions and Events, the CLI's errors and the dev cluster's progress, goes
//! through these two instead, which say the API's message, reason and code.

use std::error::Error;

/// What the API server said, without the debug dump: `message (Reason, code)`.
pub fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status_message(status),
        other => other.to_string(),
    }
}

/// `configmaps "coredns" not found (NotFound, 404)`.
fn status_message(status: &kube::core::Status) -> String {
    format!("{} ({}, {})", status.message, status.reason, status.code)
}

/// The clean text of an error kube prints with a debug dump, if `error` is one.
fn plain(error: &(dyn Error + 'static)) -> Option<String> {
    if let Some(e) = error.downcast_ref::<kube::Error>() {
        return Some(api_message(e));
    }
    // kube's errors give their Status as the cause, boxed.
    if let Some(status) = error.downcast_ref::<Box<kube::core::Status>>() {
        return Some(status_message(status));
    }
    error
        .downcast_ref::<kube::core::Status>()
        .map(status_message)
}

/// An error and its causes, outermost first, joined by `: ` as anyhow's `{:#}` does, but with
/// kube's errors in their clean form (also where a wrapper, such as a watcher's error, prints
/// its cause inside its own text) and a cause its wrapper already said left out. Pass an
/// `anyhow::Error` as `e.as_ref()`.
pub fn error_chain(error: &(dyn Error + 'static)) -> String {
    let links: Vec<&(dyn Error + 'static)> =
        std::iter::successors(Some(error), |e: &&(dyn Error + 'static)| (*e).source()).collect();
    let mut parts: Vec<String> = Vec::new();
    for (i, link) in links.iter().enumerate() {
        let text =
            match plain(*link) {
                Some(clean) => clean,
                None => links[i + 1..].iter().fold(link.to_string(), |text, cause| {
                    match plain(*cause) {
                        Some(clean) => text.replace(&cause.to_string(), &clean),
                        None => text,
                    }
                }),
            };
        if !text.is_empty() && !parts.iter().any(|said| said.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that says its cause in its own text and gives it as its source too.
    #[derive(Debug, thiserror::Error)]
    #[error("Kubernetes API: {}", api_message(.0))]
    struct SaysItsCause(#[source] kube::Error);

    fn not_found() -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure(r#"configmaps "coredns" not found"#, "NotFound")
                .with_code(404),
        ))
    }

    #[test]
    fn kube_errors_read_without_a_debug_dump() {
        let want = r#"configmaps "coredns" not found (NotFound, 404)"#;
        assert_eq!(api_message(&not_found()), want);
        assert_eq!(error_chain(&not_found()), want);

        // Through anyhow's context, as the CLI sees it.
        let e = anyhow::Error::new(not_found()).context("reading the Corefile");
        assert_eq!(
            error_chain(e.as_ref()),
            format!("reading the Corefile: {want}")
        );

        // A wrapper that prints its cause inside its own text.
        let e = kube::runtime::watcher::Error::InitialListFailed(not_found());
        let text = error_chain(&e);
        assert_eq!(
            text,
            format!("failed to perform initial object list: {want}")
        );
        assert!(!text.contains("Status {"), "{text}");

        // A wrapper that already says its cause, as the controller's Error does.
        let e = SaysItsCause(not_found());
        assert_eq!(error_chain(&e), format!("Kubernetes API: {want}"));
    }
}
