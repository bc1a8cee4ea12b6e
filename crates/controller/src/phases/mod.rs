//! The reconcile's phases, one module each, in the order the pipeline runs them: resolve the
//! policies, isolate the namespace, keep the credentials, provision the control plane, sync the
//! tenant (and `settle`: wait until it can take a first pod); `report` says where it got to.
//! Each takes the [`Context`](crate::context::Context) and either hands the next phase what it
//! needs or stops with the progress to report.

pub(crate) mod credentials;
pub(crate) mod isolate;
pub(crate) mod provision;
pub(crate) mod report;
pub(crate) mod resolve;
pub(crate) mod settle;
pub(crate) mod sync;

use crate::Error;
use crate::status::Progress;

/// Why a phase did not hand over to the next one.
pub(crate) enum Halt {
    /// Not yet, or not at all: this is where the tenant got to, for status.
    Stop(Progress),
    /// The reconcile failed: retried with back-off, and said in status.
    Failed(Error),
}

impl From<Error> for Halt {
    fn from(e: Error) -> Self {
        Halt::Failed(e)
    }
}

impl From<kube::Error> for Halt {
    fn from(e: kube::Error) -> Self {
        Halt::Failed(e.into())
    }
}

/// What a phase gives the next one, or why it stops.
pub(crate) type Phase<T> = Result<T, Halt>;

/// Stop here with `progress`.
pub(crate) fn stop<T>(progress: Progress) -> Phase<T> {
    Err(Halt::Stop(progress))
}
