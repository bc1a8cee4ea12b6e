//! Which of the runtime's two watches an event came from: control-plane pods, or the tenants'
//! CoreDNS copies.

/// Which pods a watch event is about.
#[derive(Clone, Copy, Debug)]
pub(super) enum Runs {
    ControlPlane,
    Dns,
}

impl Runs {
    pub(super) fn what(self) -> &'static str {
        match self {
            Runs::ControlPlane => "control-plane",
            Runs::Dns => "CoreDNS",
        }
    }
}
