//! Whether this machine and this namespace can run a real node: root, writable cgroups, free
//! inotify instances, the tools on PATH, and a network namespace of our own with no way out.

use std::path::Path;

use super::BRIDGE;

/// Why this machine or namespace cannot run a real node, in one line; `Ok` when it can.
pub fn preflight() -> std::result::Result<(), String> {
    machine_allows()?;
    isolated()
}

/// Why this machine cannot run a real node at all (whatever the namespace), in one line.
pub fn machine_allows() -> std::result::Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root: a kubelet and containerd need root".into());
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
        .map_err(|e| format!("cgroups are not writable ({}: {e})", cgroup_dir.display()))?;
    inotify_headroom(INOTIFY_HEADROOM)?;
    for tool in ["ip", "nft", "iptables-nft", "unshare"] {
        if !on_path(tool) {
            return Err(format!(
                "`{tool}` is not installed (testenv/packages.sh installs it)"
            ));
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
fn inotify_headroom(wanted: usize) -> std::result::Result<(), String> {
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
            Err(format!(
                "only {free} inotify instances are free for this user ({e}; \
                 fs.inotify.max_user_instances is {limit}, and other processes hold the rest) \
                 and a real node needs {wanted}: stop other test runs or dev clusters, or raise \
                 the limit (sysctl fs.inotify.max_user_instances=512)"
            ))
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
pub fn isolated() -> std::result::Result<(), String> {
    // /proc/self/net is this namespace's view; /sys/class/net is the view of whoever mounted /sys.
    let devices = std::fs::read_to_string("/proc/self/net/dev")
        .map_err(|e| format!("/proc/self/net/dev: {e}"))?;
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
        return Err(format!(
            "this network namespace has interfaces a real node must not use ({}): run it in a \
             namespace of its own (`unshare --net --mount --pid --fork`, then `ip link set lo up`)",
            foreign.join(", ")
        ));
    }
    let routes = std::fs::read_to_string("/proc/self/net/route").map_err(|e| e.to_string())?;
    if routes
        .lines()
        .skip(1)
        .any(|l| l.split_whitespace().nth(1) == Some("00000000"))
    {
        return Err("this network namespace has a default route".into());
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
        let why = inotify_headroom(1 << 20).unwrap_err();
        assert!(why.contains("fs.inotify.max_user_instances"), "{why}");
        assert!(why.contains("sysctl"), "{why}");
        assert_eq!(inotify_headroom(2), Ok(()));
    }
}
