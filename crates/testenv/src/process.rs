//! Child processes that never outlive the test binary: they are spawned from one thread that
//! lives as long as the process (so `PR_SET_PDEATHSIG` only fires when the process dies), and a
//! normal exit stops them through an `atexit` hook.

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Work for the spawner thread: start a child, or change the thread's own state (which every
/// child started after it inherits).
enum SpawnRequest {
    Spawn(Command, mpsc::Sender<std::io::Result<Child>>),
    Run(
        Box<dyn FnOnce() -> std::io::Result<()> + Send>,
        mpsc::Sender<std::io::Result<()>>,
    ),
}

static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
static CHILDREN: Mutex<Vec<Child>> = Mutex::new(Vec::new());
static REMOVE_AT_EXIT: Mutex<Vec<std::path::PathBuf>> = Mutex::new(Vec::new());
/// Folders to remove at exit that only the running processes can name (asked before they stop).
type Finder = fn() -> Vec<std::path::PathBuf>;
static FIND_AT_EXIT: Mutex<Vec<Finder>> = Mutex::new(Vec::new());

/// Remove `dir` when the process exits normally, after its processes have stopped, unless
/// `TENANTPLANE_TESTENV_KEEP` is set.
pub fn remove_at_exit(dir: &Path) {
    spawner();
    if std::env::var_os("TENANTPLANE_TESTENV_KEEP").is_none()
        && let Ok(mut dirs) = REMOVE_AT_EXIT.lock()
    {
        dirs.push(dir.to_path_buf());
    }
}

/// At exit, before the processes stop, remove the folders `find` names then (unless
/// `TENANTPLANE_TESTENV_KEEP` is set).
pub fn remove_found_at_exit(find: Finder) {
    spawner();
    if std::env::var_os("TENANTPLANE_TESTENV_KEEP").is_none()
        && let Ok(mut finders) = FIND_AT_EXIT.lock()
    {
        finders.push(find);
    }
}

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("testenv-spawner".into())
            .spawn(move || {
                for request in rx {
                    match request {
                        SpawnRequest::Spawn(mut cmd, reply) => {
                            let _ = reply.send(cmd.spawn());
                        }
                        SpawnRequest::Run(work, reply) => {
                            let _ = reply.send(work());
                        }
                    }
                }
                // Keep this thread (the children's parent thread) alive until the process ends.
                loop {
                    std::thread::park();
                }
            })
            .expect("a thread can be started");
        // SAFETY: registering a plain extern "C" function with no captured state.
        unsafe {
            libc::atexit(stop_all_at_exit);
        }
        Mutex::new(tx)
    })
}

extern "C" fn stop_all_at_exit() {
    let found: Vec<std::path::PathBuf> = match FIND_AT_EXIT.lock() {
        Ok(finders) => finders.iter().flat_map(|find| find()).collect(),
        Err(_) => Vec::new(),
    };
    stop_all();
    if let Ok(dirs) = REMOVE_AT_EXIT.lock() {
        for dir in dirs.iter().chain(&found) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A process of ours, by pid, and the log file it writes.
#[derive(Clone, Debug)]
pub struct Handle {
    /// The name it was started under, for messages.
    pub name: String,
    /// Its process id.
    pub pid: u32,
}

/// A process's memory in KiB, from `/proc/<pid>/smaps_rollup`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessMemory {
    /// Resident, its shared pages (a binary's text, which every process of that binary shares)
    /// counted in full.
    pub rss: u64,
    /// Resident, each shared page divided among the processes that share it.
    pub pss: u64,
    /// Resident and its alone: what it costs beyond what is shared.
    pub private: u64,
}

impl std::ops::Add for ProcessMemory {
    type Output = Self;
    fn add(self, o: Self) -> Self {
        Self {
            rss: self.rss + o.rss,
            pss: self.pss + o.pss,
            private: self.private + o.private,
        }
    }
}

/// The memory of process `pid`, or `None` when it is gone.
pub fn memory(pid: u32) -> Option<ProcessMemory> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    Some(ProcessMemory {
        rss: field("Rss"),
        pss: field("Pss"),
        private: field("Private_Clean") + field("Private_Dirty"),
    })
}

/// Start `program` with `args`, its stdout and stderr going to `log`.
pub fn spawn(
    name: &str,
    program: &Path,
    args: &[String],
    env: &[(&str, &str)],
    log: &Path,
) -> std::io::Result<Handle> {
    let out = File::create(log)?;
    let err = out.try_clone()?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner()
        .lock()
        .map_err(|_| std::io::Error::other("spawner lock poisoned"))?
        .send(SpawnRequest::Spawn(cmd, tx))
        .map_err(|_| std::io::Error::other("spawner thread is gone"))?;
    let child = rx
        .recv()
        .map_err(|_| std::io::Error::other("spawner thread is gone"))??;
    let handle = Handle {
        name: name.to_string(),
        pid: child.id(),
    };
    CHILDREN
        .lock()
        .map_err(|_| std::io::Error::other("children lock poisoned"))?
        .push(child);
    Ok(handle)
}

/// Give the children started from now on a mount namespace of their own (the spawner thread's,
/// made private so nothing propagates back), with each `(file, target)` bind-mounted over its
/// target there. Once per process; later calls only add bind mounts.
pub fn private_mounts(binds: Vec<(std::path::PathBuf, std::path::PathBuf)>) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    static UNSHARED: AtomicBool = AtomicBool::new(false);
    let work = move || -> std::io::Result<()> {
        let check = |rc: libc::c_int| {
            if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        };
        if !UNSHARED.swap(true, Ordering::SeqCst) {
            // SAFETY: plain syscalls on this thread; CLONE_NEWNS unshares this thread's mounts
            // (and its fs information) only, never the rest of the process.
            unsafe {
                check(libc::unshare(libc::CLONE_NEWNS))?;
                check(libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))?;
            }
        }
        for (source, target) in binds {
            let src = CString::new(source.as_os_str().as_bytes())?;
            let dst = CString::new(target.as_os_str().as_bytes())?;
            // SAFETY: as above.
            unsafe {
                check(libc::mount(
                    src.as_ptr(),
                    dst.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ))
                .map_err(|e| {
                    std::io::Error::other(format!(
                        "bind-mounting {} over {}: {e}",
                        source.display(),
                        target.display()
                    ))
                })?;
            }
        }
        Ok(())
    };
    let (tx, rx) = mpsc::channel();
    spawner()
        .lock()
        .map_err(|_| std::io::Error::other("spawner lock poisoned"))?
        .send(SpawnRequest::Run(Box::new(work), tx))
        .map_err(|_| std::io::Error::other("spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| std::io::Error::other("spawner thread is gone"))?
}

/// Has this process exited? Returns its exit status text when it has.
pub fn exited(handle: &Handle) -> Option<String> {
    let mut children = CHILDREN.lock().ok()?;
    let child = children.iter_mut().find(|c| c.id() == handle.pid)?;
    match child.try_wait() {
        Ok(Some(status)) => Some(status.to_string()),
        _ => None,
    }
}

/// Stop one process: SIGTERM, then SIGKILL if it lingers.
pub fn stop(handle: &Handle) {
    let Ok(mut children) = CHILDREN.lock() else {
        return;
    };
    if let Some(pos) = children.iter().position(|c| c.id() == handle.pid) {
        let mut child = children.remove(pos);
        terminate(&mut child);
    }
}

/// Kill a process at once (SIGKILL), as a crash would end it, and reap it.
pub fn kill(handle: &Handle) {
    let Ok(mut children) = CHILDREN.lock() else {
        return;
    };
    if let Some(pos) = children.iter().position(|c| c.id() == handle.pid) {
        let mut child = children.remove(pos);
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Stop every process started here, newest first: clients before the API server, the API server
/// before etcd (an API server whose etcd went first hangs in shutdown).
pub fn stop_all() {
    let children: Vec<Child> = match CHILDREN.lock() {
        Ok(mut c) => c.drain(..).collect(),
        Err(_) => return,
    };
    for mut child in children.into_iter().rev() {
        terminate(&mut child);
    }
}

fn terminate(child: &mut Child) {
    // SAFETY: as above.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    wait_or_kill(child, Duration::from_secs(5));
}

fn wait_or_kill(child: &mut Child, grace: Duration) {
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A free loopback port below the kernel's ephemeral range, so an outgoing connection cannot take
/// it between our check and the component's bind. One walk of the range per process (the seed is
/// drawn once, and the stride is coprime with the range's size): no two calls give the same port
/// until all 12,000 were given, so a port given and not yet bound is never given again.
pub fn free_port() -> crate::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static SEED: OnceLock<u32> = OnceLock::new();
    let seed = *SEED.get_or_init(|| {
        std::process::id().wrapping_mul(7919)
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
    });
    for _ in 0..1000 {
        let n = u64::from(NEXT.fetch_add(1, Ordering::Relaxed));
        // In u64: no wrap-around breaks the walk.
        let step = (u64::from(seed) + n * 2_654_435_761) % 12_000;
        let port = 20_000 + step as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(crate::Error::Io(
        "no free loopback port between 20000 and 32000".into(),
    ))
}

/// The last `lines` lines of a file, or a note that it could not be read.
pub fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ports_given_are_never_given_again() {
        let ports: Vec<u16> = (0..500).map(|_| super::free_port().unwrap()).collect();
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
        assert!(ports.iter().all(|p| (20_000..32_000).contains(p)));
    }
}
