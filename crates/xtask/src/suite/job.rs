//! One test binary run to its end: its output goes to a log file, and what it did is read back
//! from it (the tests' counts, what `isolated.sh` found left behind) with the CPU time its
//! processes used.

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use super::inotify;

/// A test binary to run.
#[derive(Clone, Debug)]
pub struct Job {
    /// As cargo names it: `sync (tests/sync/main.rs)`, `tenantplane_api (unittests src/lib.rs)`.
    pub label: String,
    pub program: OsString,
    pub args: Vec<OsString>,
    /// Where it runs: its package's folder, as under `cargo test`.
    pub dir: PathBuf,
}

/// The tests a binary ran, from its `test result:` lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, other: Counts) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.ignored += other.ignored;
    }
}

/// A finished job.
#[derive(Debug)]
pub struct Finished {
    pub label: String,
    pub seconds: f64,
    /// User and system CPU seconds of the processes it waited for, its own included.
    pub cpu_seconds: f64,
    /// The most inotify instances its processes held at once.
    pub inotify: u32,
    /// How busy the machine's CPUs were while it ran, 1.0 for all of them.
    pub machine_busy: Option<f64>,
    /// Exited 0.
    pub ok: bool,
    /// How it ended when not `ok`: the exit code, the signal, or why it could not start.
    pub ended: String,
    pub counts: Counts,
    /// Processes, cgroups and network namespaces left behind, when `isolated.sh` counted them.
    pub left: Option<[u64; 3]>,
    pub log: PathBuf,
}

/// Run `job` with its output in `log`, and wait for it.
pub fn run(job: &Job, log: &Path) -> Finished {
    let started = Instant::now();
    let machine = super::Machine::now();
    let (ok, ended, cpu_seconds, inotify) = match spawn_and_wait(job, log) {
        Ok((status, cpu, inotify)) => (status == Ok(0), describe(status), cpu, inotify),
        Err(e) => (false, format!("could not run: {e}"), 0.0, 0),
    };
    let text = std::fs::read_to_string(log).unwrap_or_default();
    Finished {
        label: job.label.clone(),
        seconds: started.elapsed().as_secs_f64(),
        cpu_seconds,
        inotify,
        machine_busy: machine.busy_since(),
        ok,
        ended,
        counts: counts(&text),
        left: left_behind(&text),
        log: log.to_path_buf(),
    }
}

fn describe(status: Result<i32, i32>) -> String {
    match status {
        Ok(code) => format!("exit code {code}"),
        Err(signal) => format!("killed by signal {signal}"),
    }
}

/// Start the job and wait for it: its exit code (`Err` holds the signal that ended it), its
/// processes' CPU seconds and the most inotify instances they held at once.
fn spawn_and_wait(job: &Job, log: &Path) -> std::io::Result<(Result<i32, i32>, f64, u32)> {
    let out = File::create(log)?;
    let err = out.try_clone()?;
    let child = Command::new(&job.program)
        .args(&job.args)
        .current_dir(&job.dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()?;
    let pid = libc::pid_t::try_from(child.id()).map_err(std::io::Error::other)?;
    let peak = inotify::Peak::watch(pid);
    let (status, cpu) = wait_with_usage(pid)?;
    Ok((status, cpu, peak.most()))
}

/// `wait4` rather than `Child::wait`: std does not give the child's resource usage, and the CPU
/// time of everything the job waited for is what tells which jobs fit beside each other.
fn wait_with_usage(pid: libc::pid_t) -> std::io::Result<(Result<i32, i32>, f64)> {
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero `rusage` is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `status` and `usage` are valid for writes for the call; `pid` is our child,
        // which nothing else waits for.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let cpu = secs(usage.ru_utime) + secs(usage.ru_stime);
    let code = if libc::WIFEXITED(status) {
        Ok(libc::WEXITSTATUS(status))
    } else {
        Err(libc::WTERMSIG(status))
    };
    Ok((code, cpu))
}

/// The sum of a log's `test result: … N passed; N failed; N ignored; …` lines.
pub fn counts(log: &str) -> Counts {
    let mut total = Counts::default();
    for line in log.lines() {
        let Some(rest) = line.strip_prefix("test result: ") else {
            continue;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => total.passed += n,
                "failed" => total.failed += n,
                "ignored" => total.ignored += n,
                _ => {}
            }
        }
    }
    total
}

/// `isolated.sh`'s last `left behind: N processes, N cgroups, N network namespaces` line.
pub fn left_behind(log: &str) -> Option<[u64; 3]> {
    let line = log
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("left behind: "))?;
    let mut numbers = line
        .split(',')
        .map(|part| part.split_whitespace().next()?.parse::<u64>().ok());
    Some([numbers.next()??, numbers.next()??, numbers.next()??])
}

/// What to show of a failed job's log: from cargo's `failures:` section on, or its last lines
/// when it has none (a crash, a build that failed).
pub fn failure_excerpt(log: &str) -> String {
    const TAIL: usize = 200;
    let lines: Vec<&str> = log.lines().collect();
    let from = lines
        .iter()
        .position(|l| *l == "failures:")
        .unwrap_or(lines.len().saturating_sub(TAIL));
    lines[from..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "running 3 tests\n\
        test a ... ok\n\
        failures:\n\
        \n---- b stdout ----\nboom\n\
        test result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 2.00s\n\
        \n\
        test result: ok. 4 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s\n\
        left behind: 0 processes, 2 cgroups, 1 network namespaces\n";

    #[test]
    fn counts_add_every_result_line() {
        assert_eq!(
            counts(LOG),
            Counts {
                passed: 5,
                failed: 1,
                ignored: 1
            }
        );
        assert_eq!(counts("no tests here"), Counts::default());
    }

    #[test]
    fn what_was_left_behind_is_read_from_the_last_line() {
        assert_eq!(left_behind(LOG), Some([0, 2, 1]));
        assert_eq!(left_behind("left behind: many"), None);
        assert_eq!(left_behind("nothing"), None);
    }

    #[test]
    fn a_failure_shows_the_failures_section_or_the_tail() {
        assert!(failure_excerpt(LOG).starts_with("failures:\n\n---- b stdout ----\nboom"));
        let crash: String = (0..300).map(|i| format!("line {i}\n")).collect();
        let excerpt = failure_excerpt(&crash);
        assert!(excerpt.starts_with("line 100\n") && excerpt.ends_with("line 299"));
    }

    #[test]
    fn a_job_runs_in_its_folder_and_reports_its_end() {
        let dir = std::env::temp_dir().join(format!("xtask-job-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a folder for the test");
        let job = Job {
            label: "shell".into(),
            program: "sh".into(),
            args: vec![
                "-c".into(),
                "pwd; echo 'test result: ok. 2 passed; 0 failed; 0 ignored;'; exit 3".into(),
            ],
            dir: dir.clone(),
        };
        let done = run(&job, &dir.join("log"));
        let log = std::fs::read_to_string(&done.log).expect("the log");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!done.ok);
        assert_eq!(done.ended, "exit code 3");
        assert_eq!(done.counts.passed, 2);
        assert!(log.starts_with(&dir.display().to_string()), "{log}");
    }
}
