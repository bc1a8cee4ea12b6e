//! Whether this machine and this namespace can run a real node: root, writable cgroups, free
//! inotify instances, the tools on PATH, and a network namespace of our own with no way out.

use std::path::Path;

use super::BRIDGE;

/// Why this machine or this network namespace cannot run a real node, each in one line that says
/// what to change.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unfit {
    /// Not running as root.
    #[error("not root: a kubelet and containerd need root")]
    NotRoot,
    /// The cgroup folder refused a new cgroup.
    #[error("cgroups are not writable ({dir}: {error})")]
    CgroupsReadOnly {
        /// The hierarchy tried.
        dir: String,
        /// What creating a cgroup there said.
        error: String,
    },
    /// A tool the node needs is not on `PATH`.
    #[error("`{0}` is not installed (testenv/packages.sh installs it)")]
    Missing(&'static str),
    /// Too few inotify instances are free for this user.
    #[error(
        "only {free} inotify instances are free for this user ({error}; \
         fs.inotify.max_user_instances is {limit}, and other processes hold the rest) \
         and a real node needs {wanted}: stop other test runs or dev clusters, or raise \
         the limit (sysctl fs.inotify.max_user_instances=512)"
    )]
    Inotify {
        /// How many could be opened.
        free: usize,
        /// How many the node needs.
        wanted: usize,
        /// The limit, as the kernel says it.
        limit: String,
        /// What the open that failed said.
        error: String,
    },
    /// This namespace's interfaces or routes could not be read.
    #[error("reading {path}: {error}")]
    Unreadable {
        /// The file.
        path: &'static str,
        /// What reading it said.
        error: String,
    },
    /// The namespace has interfaces of the machine's (a way out).
    #[error(
        "this network namespace has interfaces a real node must not use ({}): run it in a \
         namespace of its own (`unshare --net --mount --pid --fork`, then `ip link set lo up`)",
        .0.join(", ")
    )]
    ForeignInterfaces(Vec<String>),
    /// The namespace has a default route.
    #[error("this network namespace has a default route")]
    DefaultRoute,
}

/// Why this machine or namespace cannot run a real node; `Ok` when it can.
pub fn preflight() -> Result<(), Unfit> {
    machine_allows()?;
    isolated()
}

/// Why this machine cannot run a real node at all (whatever the namespace).
pub fn machine_allows() -> Result<(), Unfit> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Unfit::NotRoot);
    }
    let memory = Path::new("/sys/fs/cgroup/memory");
    let unified = Path::new("/sys/fs/cgroup/cgroup.controllers");
    let cgroup_dir = if unified.exists() {
        Path::new("/sys/fs/cgroup")
    } else {
        memory
    };
    let probe = cgroup_dir.join(format!("tenantplane-probe-{}", std::process::id()));
    std::fs::create_dir(&probe)
        .and_then(|_| std::fs::remove_dir(&probe))
        .map_err(|e| Unfit::CgroupsReadOnly {
            dir: cgroup_dir.display().to_string(),
            error: e.to_string(),
        })?;
    inotify_headroom(INOTIFY_HEADROOM)?;
    for tool in ["ip", "nft", "iptables-nft", "unshare"] {
        if !on_path(tool) {
            return Err(Unfit::Missing(tool));
        }
    }
    Ok(())
}

/// The inotify instances a real node and its tenants' control planes take together, with room:
/// the kubelet, containerd and kube-proxy hold a few each, every tenant API server six.
const INOTIFY_HEADROOM: usize = 48;

/// Can this user open `wanted` more inotify instances? The limit (`fs.inotify.max_user_instances`,
/// 128 by default) is per user across the whole machine, and a kubelet that meets it fails to start
/// with `inotify_init: too many open files`, far from the cause. Other processes' instances cannot
/// be counted from inside a PID namespace, so this opens them and closes them again.
fn inotify_headroom(wanted: usize) -> Result<(), Unfit> {
    let mut opened = Vec::new();
    let mut failure = None;
    while opened.len() < wanted {
        // SAFETY: inotify_init1 has no preconditions; a valid descriptor is closed below.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        if fd < 0 {
            failure = Some(std::io::Error::last_os_error());
            break;
        }
        opened.push(fd);
    }
    let free = opened.len();
    for fd in opened {
        // SAFETY: fd was opened above and is closed once.
        unsafe { libc::close(fd) };
    }
    match failure {
        None => Ok(()),
        Some(e) => {
            let limit = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into());
            Err(Unfit::Inotify {
                free,
                wanted,
                limit,
                error: e.to_string(),
            })
        }
    }
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths)
            .chain(["/usr/sbin".into(), "/sbin".into()])
            .any(|d| d.join(program).is_file())
    })
}

/// Is this network namespace one of our own with no way out: no interface but loopback and what
/// the real node makes (its bridge and the pods' veths), and no default route?
pub fn isolated() -> Result<(), Unfit> {
    let read = |path: &'static str| {
        std::fs::read_to_string(path).map_err(|e| Unfit::Unreadable {
            path,
            error: e.to_string(),
        })
    };
    // /proc/self/net is this namespace's view; /sys/class/net is the view of whoever mounted /sys.
    let devices = read("/proc/self/net/dev")?;
    let mut foreign = Vec::new();
    for line in devices.lines().skip(2) {
        let name = line
            .split(':')
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        if !(name == "lo" || name == BRIDGE || name.starts_with("veth")) {
            foreign.push(name);
        }
    }
    if !foreign.is_empty() {
        foreign.sort();
        return Err(Unfit::ForeignInterfaces(foreign));
    }
    let routes = read("/proc/self/net/route")?;
    if routes
        .lines()
        .skip(1)
        .any(|l| l.split_whitespace().nth(1) == Some("00000000"))
    {
        return Err(Unfit::DefaultRoute);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_out_of_inotify_instances_is_named_with_the_limit_and_the_fix() {
        assert_eq!(inotify_headroom(2), Ok(()));
        // More than any machine allows a user (the limit, or the open-file limit, ends it first);
        // every instance it opened is closed again.
        let why = inotify_headroom(1 << 20).unwrap_err().to_string();
        assert!(why.contains("fs.inotify.max_user_instances"), "{why}");
        assert!(why.contains("sysctl"), "{why}");
        assert_eq!(inotify_headroom(2), Ok(()));
    }
}
