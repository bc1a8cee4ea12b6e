//! inotify instances, the other thing test binaries share besides the CPUs. The limit
//! (`fs.inotify.max_user_instances`, 128 by default) is per user across the machine, and a binary
//! with a real node and its tenants' API servers holds 40 to 100 at its peak: three side by side
//! run out, and the third's node refuses to start. So `make test` raises the limit first
//! ([`raise_limit`]), and the suite measures what each binary held at most, keeps it with its
//! times, and starts a binary only while the peaks of those running and its own fit in what was
//! free when the run began (on a machine where the limit cannot be raised, binaries wait).
//!
//! Counted from `/proc` (the descriptors that are `anon_inode:inotify` in the job's process tree)
//! rather than by a cgroup or a user namespace: the kernel keeps no per-process-tree count, and
//! a user namespace's instances still count against the machine's limit.

use std::collections::HashMap;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How many more instances this user can open now: opened one by one up to `most`, then closed.
/// Other users' and other namespaces' instances cannot be counted from here, so this asks the
/// kernel the only way it answers.
pub fn free(most: u32) -> u32 {
    let mut opened = Vec::new();
    while opened.len() < most as usize {
        // SAFETY: inotify_init1 has no preconditions; a valid descriptor is closed below.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        if fd < 0 {
            break;
        }
        opened.push(fd);
    }
    let n = u32::try_from(opened.len()).unwrap_or(most);
    for fd in opened {
        // SAFETY: fd was opened above and is closed once.
        unsafe { libc::close(fd) };
    }
    n
}

/// The machine's limit per user, or `fallback` when it cannot be read.
pub fn limit(fallback: u32) -> u32 {
    std::fs::read_to_string(LIMIT_FILE)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(fallback)
}

/// Where the kernel keeps the limit of inotify instances per user.
const LIMIT_FILE: &str = "/proc/sys/fs/inotify/max_user_instances";

/// Raise the limit per user to `wanted` when it is lower: what this did, or why it could not
/// (not root, `/proc/sys` read-only in a container). Never lowered, and not set back at the end:
/// a dev cluster started meanwhile may need the room.
pub fn raise_limit(wanted: u32) -> Result<Option<u32>, std::io::Error> {
    let now = limit(0);
    if now >= wanted {
        return Ok(None);
    }
    std::fs::write(LIMIT_FILE, format!("{wanted}\n"))?;
    Ok(Some(now))
}

/// Each process's parent, from `/proc/*/stat`.
fn parents() -> HashMap<i32, i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return HashMap::new();
    };
    dir.filter_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        Some((pid, parent_of(&stat)?))
    })
    .collect()
}

/// The parent in a `/proc/PID/stat` line: the second field after the command, which is in
/// parentheses and may hold spaces and parentheses of its own.
fn parent_of(stat: &str) -> Option<i32> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// `root` and every process under it.
fn tree(root: i32, parents: &HashMap<i32, i32>) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (&pid, &parent) in parents {
        children.entry(parent).or_default().push(pid);
    }
    let mut out = vec![root];
    let mut i = 0;
    while let Some(&pid) = out.get(i) {
        out.extend(children.get(&pid).into_iter().flatten().copied());
        i += 1;
    }
    out
}

/// The inotify instances open in `pid`'s descriptors.
fn held_by(pid: i32) -> u32 {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    let n = fds
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.as_os_str() == "anon_inode:inotify")
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The inotify instances held by `root` and every process under it now.
pub fn held_by_tree(root: i32) -> u32 {
    tree(root, &parents()).into_iter().map(held_by).sum()
}

/// How often a running job's instances are counted.
const EVERY: Duration = Duration::from_secs(2);

/// Counts a process tree's instances every two seconds until stopped, keeping the most.
pub struct Peak {
    /// Dropped to stop the count at once, rather than after its sleep.
    stop: mpsc::Sender<()>,
    thread: JoinHandle<u32>,
}

impl Peak {
    /// Start counting under `root`.
    pub fn watch(root: i32) -> Peak {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let mut most = 0;
            loop {
                most = most.max(held_by_tree(root));
                if stopped.recv_timeout(EVERY) != Err(mpsc::RecvTimeoutError::Timeout) {
                    return most;
                }
            }
        });
        Peak { stop, thread }
    }

    /// Stop counting: the most seen at once.
    pub fn most(self) -> u32 {
        drop(self.stop);
        self.thread.join().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_is_read_past_a_command_with_parentheses() {
        assert_eq!(parent_of("42 (sh) S 7 42 42 0"), Some(7));
        assert_eq!(parent_of("42 (a (b) c) R 9 1 1"), Some(9));
        assert_eq!(parent_of("nonsense"), None);
    }

    #[test]
    fn a_tree_is_its_root_and_everything_under_it() {
        let parents = HashMap::from([(2, 1), (3, 2), (4, 2), (5, 1), (6, 3)]);
        let mut under_two = tree(2, &parents);
        under_two.sort_unstable();
        assert_eq!(under_two, [2, 3, 4, 6]);
        assert_eq!(tree(9, &parents), [9]);
    }

    #[test]
    fn instances_this_process_opens_are_counted_and_free_ones_found() {
        let me = i32::try_from(std::process::id()).expect("a pid");
        let before = held_by(me);
        // SAFETY: no preconditions; closed below.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        assert_eq!(held_by(me), before + 1);
        assert!(held_by_tree(me) > before);
        // SAFETY: opened above, closed once.
        unsafe { libc::close(fd) };
        assert_eq!(free(2), 2);
        assert!(limit(0) > 0);
    }

    #[test]
    fn the_peak_counts_what_a_child_of_a_child_held() {
        // GNU tail follows a file with an inotify instance; it runs under a shell, as a test's
        // processes run under isolated.sh.
        let file = std::env::temp_dir().join(format!("xtask-peak-{}", std::process::id()));
        std::fs::write(&file, "").expect("a file to follow");
        let mut shell = std::process::Command::new("sh")
            .arg("-c")
            .arg("tail -f \"$0\" & sleep 2.5; kill $!")
            .arg(&file)
            .spawn()
            .expect("sh runs");
        let peak = Peak::watch(i32::try_from(shell.id()).expect("a pid"));
        let _ = shell.wait();
        let _ = std::fs::remove_file(&file);
        assert_eq!(peak.most(), 1);
    }
}
