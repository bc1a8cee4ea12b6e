//! The real node's cgroups: a root of its own under `tenantplane/<id>` in every hierarchy (so two
//! nodes on one machine never share `kubepods`), removed when it stops, and removed at the next
//! start when a node was killed before it could clean up (its lock is free then).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

const CGROUP_FS: &str = "/sys/fs/cgroup";
const PARENT: &str = "tenantplane";

/// The folders of every hierarchy the kubelet and runc use: each v1 controller mount (those with
/// a `tasks` file) and, on a hybrid machine, the v2 one beside them (`unified`, where runc makes
/// its cgroups too); or the one v2 hierarchy.
fn hierarchies() -> Vec<PathBuf> {
    let root = Path::new(CGROUP_FS);
    if root.join("cgroup.controllers").exists() {
        return vec![root.to_path_buf()];
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.join("tasks").exists() || p.join("cgroup.controllers").exists())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

fn locks_dir() -> PathBuf {
    std::env::temp_dir().join("tenantplane-nodes")
}

fn try_lock(file: &File) -> bool {
    // SAFETY: flock on a file descriptor we own.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// Make this node's cgroup root and return it (`/tenantplane/<id>`), after removing those of
/// nodes that are gone. The lock that marks it as in use is held until the process exits.
pub(super) fn create(node_dir: &Path) -> Result<String> {
    let locks = locks_dir();
    std::fs::create_dir_all(&locks)?;
    remove_stale(&locks);
    let id = format!(
        "node-{}-{}",
        std::process::id(),
        node_dir
            .display()
            .to_string()
            .bytes()
            .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32))
    );
    let lock = File::create(locks.join(format!("{id}.lock")))?;
    if !try_lock(&lock) {
        return Err(Error::Io(format!("cgroup root {id} is in use")));
    }
    // Held for the life of the process: a killed process frees it, which marks the cgroups stale.
    std::mem::forget(lock);
    for h in hierarchies() {
        for dir in [h.join(PARENT), h.join(PARENT).join(&id)] {
            std::fs::create_dir_all(&dir)
                .map_err(|e| Error::Io(format!("creating cgroup {}: {e}", dir.display())))?;
            // A v1 cpuset starts empty and takes no task until given its parent's CPUs and memory.
            for key in ["cpuset.cpus", "cpuset.mems"] {
                let parent = dir.parent().map(|p| p.join(key));
                if let Some(parent) = parent.filter(|p| p.exists()) {
                    let value = std::fs::read_to_string(&parent)?;
                    std::fs::write(dir.join(key), value.trim())?;
                }
            }
        }
    }
    Ok(format!("/{PARENT}/{id}"))
}

/// Remove the cgroups of every node whose lock no process holds, killing what is left in them.
fn remove_stale(locks: &Path) {
    let Ok(entries) = std::fs::read_dir(locks) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(id) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".lock"))
            .map(str::to_string)
        else {
            continue;
        };
        let Ok(file) = File::open(&path) else {
            continue;
        };
        // The lock goes only with the cgroups, so a start that could not remove them all leaves
        // them to the next one.
        if try_lock(&file) && remove(&format!("/{PARENT}/{id}")) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Kill every process in the cgroup tree `root` and remove it, deepest first, in every hierarchy;
/// whether it is gone. Processes may take a while to die on a loaded machine (one in the middle of
/// a mount), so it keeps at it for up to half a minute.
pub(super) fn remove(root: &str) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let tops: Vec<PathBuf> = hierarchies()
        .into_iter()
        .map(|h| h.join(root.trim_start_matches('/')))
        .collect();
    loop {
        for top in tops.iter().filter(|t| t.exists()) {
            kill_and_remove(top);
        }
        if tops.iter().all(|t| !t.exists()) {
            for h in hierarchies() {
                // The shared parent goes with the last node (another node's keeps it).
                let _ = std::fs::remove_dir(h.join(PARENT));
            }
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// One pass over a tree: kill what runs in each cgroup, remove those that are empty, deepest
/// first.
fn kill_and_remove(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                kill_and_remove(&entry.path());
            }
        }
    }
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Kill the containerd shims of the node whose containerd listens on `socket` (they outlive
/// containerd by design, and would keep their containers running).
pub(super) fn kill_shims(socket: &Path) {
    let needle = socket.display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.contains("containerd-shim") && cmdline.contains(&needle) {
            // SAFETY: as above.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}
