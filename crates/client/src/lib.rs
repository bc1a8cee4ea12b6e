//! What both the operator and the test world need to talk to API servers, and nothing of either:
//! kubeconfig documents on kube's own type ([`kubeconfig`]) and kube's errors as a person reads
//! them ([`api_message`], [`error_chain`]). The controller re-exports both under its old paths;
//! the test harness uses them without linking the controller.

mod error_text;
pub mod kubeconfig;

pub use error_text::{api_message, error_chain};
