//! `xtask suite`: build the test binaries, then run several at once, each to its own log, as many
//! as fit: at most `--jobs` at a time, and beside others only while the CPU shares they used in
//! the last run add up to `--cpu` percent of the machine, and the inotify instances they held at
//! most fit in those free when the run began (see [`inotify`]). Most binaries wait on control planes
//! and timers rather than on the CPU (a third of the machine or less), and running them one
//! after another left the machine idle for most of `make test`; binaries that were busy alone run
//! beside fewer others, so none is slowed into its tests' time-outs. The longest start first.
//!
//! It prints a line when a binary starts and ends, what is still running every minute, the log of
//! each that fails (from cargo's `failures:` on), and at the end a table of every binary's
//! seconds and CPU share, slowest first, with the tests' counts and what was left behind. The
//! table is kept in `$TENANTPLANE_CACHE/test-times.tsv` for the next run; a binary that is not in
//! it yet (a fresh machine) is judged by `testenv/test-times.tsv`, the figures of a full run kept
//! in the repository. Every binary runs even
//! after one fails; the exit code is 1 when any failed.
//!
//! Ours rather than `cargo nextest`: nextest runs every test in a process of its own, and each of
//! our test binaries shares one control plane between its tests, which would start once per test.

mod build;
mod history;
mod inotify;
mod job;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use history::Figures;
use job::{Counts, Finished, Job};

/// How many jobs run at once, and the CPU share and inotify instances they may add up to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    pub jobs: usize,
    /// 1.0 is the whole machine.
    pub cpu: f64,
    pub inotify: u32,
}

impl Limits {
    /// Do jobs of these figures fit together?
    fn hold(&self, cpu: f64, inotify: u32) -> bool {
        cpu <= self.cpu && inotify <= self.inotify
    }
}

/// What a job is expected to take, from the last run; a job never seen runs first, as though it
/// needed half the machine and had a real node.
fn estimate(history: &HashMap<String, Figures>, label: &str) -> Figures {
    history.get(label).copied().unwrap_or(Figures {
        seconds: f64::INFINITY,
        cpu: 0.5,
        inotify: history::UNKNOWN_INOTIFY,
    })
}

/// The next job to start, given the `running` ones (their CPU shares, inotify instances and
/// estimated seconds left):
/// the first of `pending` (longest first) when it fits beside them, any job when none runs.
///
/// When the first does not fit, it waits for room: the moment, by the running jobs' estimates,
/// when enough of them will have ended. Another job starts meanwhile only if it fits now and is
/// expected to end by then, so the longest job is never pushed later by shorter ones that keep
/// its room taken (backfilling, as batch schedulers do).
pub fn pick(pending: &[Figures], running: &[Figures], limits: Limits) -> Option<usize> {
    if pending.is_empty() || running.len() >= limits.jobs {
        return None;
    }
    if running.is_empty() {
        return Some(0);
    }
    let cpu: f64 = running.iter().map(|r| r.cpu).sum();
    let inotify: u32 = running.iter().map(|r| r.inotify).sum();
    let fits = |f: &Figures| limits.hold(cpu + f.cpu, inotify.saturating_add(f.inotify));
    if fits(&pending[0]) {
        return Some(0);
    }
    let mut ending = running.to_vec();
    ending.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let mut room_at = f64::INFINITY;
    let first = pending[0];
    let (mut cpu_left, mut inotify_left) = (cpu, inotify);
    for r in &ending {
        cpu_left -= r.cpu;
        inotify_left = inotify_left.saturating_sub(r.inotify);
        if limits.hold(
            cpu_left + first.cpu,
            inotify_left.saturating_add(first.inotify),
        ) {
            room_at = r.seconds;
            break;
        }
    }
    pending
        .iter()
        .skip(1)
        .position(|f| fits(f) && f.seconds <= room_at)
        .map(|i| i + 1)
}

/// The arguments of `xtask suite`.
struct Args {
    limits: Limits,
    /// Raise the inotify limit per user to this first, when it is lower.
    inotify_limit: Option<u32>,
    isolate: Option<PathBuf>,
    cargo_args: Vec<String>,
    test_args: Vec<String>,
}

const USAGE: &str = "usage: xtask suite [--jobs N] [--cpu PERCENT] [--inotify-limit N] [--isolate SCRIPT] \
    [-- CARGO_TEST_ARGS… [-- TEST_BINARY_ARGS…]]";

/// Arguments `xtask suite` cannot take.
#[derive(Debug, PartialEq)]
enum ArgsError {
    MissingValue(String),
    Jobs(String),
    Cpu(String),
    InotifyLimit(String),
    Unknown(String),
}

impl std::fmt::Display for ArgsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArgsError::MissingValue(flag) => write!(f, "{flag} needs a value"),
            ArgsError::Jobs(v) => write!(f, "--jobs {v:?}: give a whole number above 0"),
            ArgsError::Cpu(v) => {
                write!(f, "--cpu {v:?}: give a percentage above 0, for example 100")
            }
            ArgsError::InotifyLimit(v) => {
                write!(
                    f,
                    "--inotify-limit {v:?}: give a whole number, for example 512"
                )
            }
            ArgsError::Unknown(a) => write!(f, "unknown argument {a:?}"),
        }
    }
}

fn parse_args(args: &[String]) -> Result<Args, ArgsError> {
    let mut parsed = Args {
        limits: Limits {
            jobs: 3,
            cpu: 1.0,
            inotify: u32::MAX,
        },
        inotify_limit: None,
        isolate: None,
        cargo_args: Vec::new(),
        test_args: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or(ArgsError::MissingValue(a.clone()));
        match a.as_str() {
            "--jobs" => {
                let v = value()?;
                parsed.limits.jobs = v
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or(ArgsError::Jobs(v))?;
            }
            "--cpu" => {
                let v = value()?;
                let percent: f64 = v
                    .parse()
                    .ok()
                    .filter(|p| *p > 0.0)
                    .ok_or(ArgsError::Cpu(v))?;
                parsed.limits.cpu = percent / 100.0;
            }
            "--inotify-limit" => {
                let v = value()?;
                parsed.inotify_limit = Some(v.parse().map_err(|_| ArgsError::InotifyLimit(v))?);
            }
            "--isolate" => parsed.isolate = Some(PathBuf::from(value()?)),
            "--" => {
                let rest: Vec<String> = it.by_ref().cloned().collect();
                let split = rest.iter().position(|a| a == "--").unwrap_or(rest.len());
                parsed.cargo_args = rest[..split].to_vec();
                parsed.test_args = rest.get(split + 1..).unwrap_or_default().to_vec();
            }
            other => return Err(ArgsError::Unknown(other.to_string())),
        }
    }
    Ok(parsed)
}

/// inotify instances left free for the rest of the machine while the suite runs.
const INOTIFY_SPARE: u32 = 4;

/// How often the jobs still running are named.
const HEARTBEAT: Duration = Duration::from_secs(60);

/// Run `xtask suite ARGS`.
pub fn main(args: &[String]) -> ExitCode {
    let args = match parse_args(args) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("xtask suite: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let cache = std::env::var_os("TENANTPLANE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/tenantplane"));
    let isolate = args
        .isolate
        .as_deref()
        .map(|p| std::path::absolute(p).unwrap_or(p.to_path_buf()));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let plan = build::Plan {
        cargo: &cargo,
        cargo_args: &args.cargo_args,
        test_args: &args.test_args,
        isolate: isolate.as_deref(),
    };
    let jobs = match build::jobs(&plan) {
        Ok(jobs) => jobs,
        Err(e) => {
            eprintln!("xtask suite: {e}");
            return ExitCode::FAILURE;
        }
    };
    let times = cache.join("test-times.tsv");
    // The figures committed beside the test world stand in for binaries this machine has not run.
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testenv/test-times.tsv");
    let mut history = history::read(&committed);
    history.extend(history::read(&times));
    let logs = cache.join("test-logs");
    if let Err(e) = std::fs::create_dir_all(&logs) {
        eprintln!("xtask suite: creating {}: {e}", logs.display());
        return ExitCode::FAILURE;
    }
    let mut limits = args.limits;
    if let Some(wanted) = args.inotify_limit {
        match inotify::raise_limit(wanted) {
            Ok(None) => {}
            Ok(Some(was)) => println!(
                "inotify: raised fs.inotify.max_user_instances from {was} to {wanted}, so binaries \
                 with real nodes fit side by side (it stays so; the kernel's default is 128)"
            ),
            Err(e) => println!(
                "inotify: could not raise fs.inotify.max_user_instances to {wanted} ({e}); binaries \
                 wait for the instances they need, and the run takes longer"
            ),
        }
    }
    let limit = inotify::limit(128);
    let free = inotify::free(limit);
    limits.inotify = limits.inotify.min(free.saturating_sub(INOTIFY_SPARE));
    println!(
        "inotify: {free} of {limit} instances free for this user (fs.inotify.max_user_instances); \
         binaries run side by side while the most they held last time adds up to {}",
        limits.inotify
    );
    let machine = Machine::now();
    let started = Instant::now();
    let finished = run_all(jobs, &history, limits, &logs);
    let all_ok = finished.iter().all(|f| f.ok);
    let rows: Vec<(String, Figures)> = finished
        .iter()
        .map(|f| (f.label.clone(), figures(f)))
        .collect();
    print_table(
        &rows,
        started.elapsed().as_secs_f64(),
        machine.busy_since(),
        limits,
    );
    print_totals(&finished);
    // Read again: another run (a `make unit` meanwhile) may have kept figures of its own since.
    let mut kept = history::read(&times);
    for f in &finished {
        let previous = kept.get(&f.label).copied();
        kept.insert(
            f.label.clone(),
            to_keep(figures(f), f.machine_busy, previous),
        );
    }
    let all: Vec<(String, Figures)> = kept.into_iter().collect();
    if let Err(e) = std::fs::write(&times, history::render(&all)) {
        eprintln!("xtask suite: keeping the times in {}: {e}", times.display());
    }
    if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"))
}

fn cpus() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

fn figures(f: &Finished) -> Figures {
    Figures {
        seconds: f.seconds,
        cpu: if f.seconds > 0.0 {
            f.cpu_seconds / (f.seconds * cpus())
        } else {
            0.0
        },
        inotify: f.inotify,
    }
}

/// How busy the machine may be while a job runs for its CPU share to say what it needs.
const SATURATED: f64 = 0.95;

/// The figures to keep of a job that ran: as measured, but a CPU share measured while the
/// machine was saturated is what the job got, not what it needs (it waited for the CPUs, its
/// seconds grew and its share shrank), so it never lowers the share kept from an earlier run.
/// Without this, jobs that were starved look lighter, run together next time, and starve more.
fn to_keep(measured: Figures, busy: Option<f64>, previous: Option<Figures>) -> Figures {
    match previous {
        Some(p) if busy.is_some_and(|b| b >= SATURATED) && p.cpu > measured.cpu => Figures {
            cpu: p.cpu,
            ..measured
        },
        _ => measured,
    }
}

/// A job started and not finished.
struct Running {
    id: usize,
    label: String,
    estimate: Figures,
    since: Instant,
}

impl Running {
    /// Its CPU share, inotify instances and the seconds it is expected to run still (at least
    /// one).
    fn left(&self) -> Figures {
        Figures {
            seconds: (self.estimate.seconds - self.since.elapsed().as_secs_f64()).max(1.0),
            ..self.estimate
        }
    }
}

/// Start jobs as they fit, longest first, until every one has finished.
fn run_all(
    jobs: Vec<Job>,
    history: &HashMap<String, Figures>,
    limits: Limits,
    logs: &Path,
) -> Vec<Finished> {
    let started = Instant::now();
    let mut pending: Vec<(usize, Job, Figures)> = jobs
        .into_iter()
        .enumerate()
        .map(|(id, job)| {
            let e = estimate(history, &job.label);
            (id, job, e)
        })
        .collect();
    pending.sort_by(|a, b| b.2.seconds.total_cmp(&a.2.seconds));
    let total = pending.len();
    let (tx, rx) = mpsc::channel::<(usize, Finished)>();
    let mut running: Vec<Running> = Vec::new();
    let mut done = Vec::new();
    loop {
        loop {
            let estimates: Vec<Figures> = pending.iter().map(|p| p.2).collect();
            let left: Vec<Figures> = running.iter().map(Running::left).collect();
            let Some(i) = pick(&estimates, &left, limits) else {
                break;
            };
            let (id, job, estimate) = pending.remove(i);
            let log = logs.join(log_name(&job.label));
            running.push(Running {
                id,
                label: job.label.clone(),
                estimate,
                since: Instant::now(),
            });
            say(
                started,
                &format!("start    {} ({} running)", job.label, running.len()),
            );
            let tx = tx.clone();
            std::thread::spawn(move || {
                let _ = tx.send((id, job::run(&job, &log)));
            });
        }
        if running.is_empty() {
            break;
        }
        match rx.recv_timeout(HEARTBEAT) {
            Ok((id, finished)) => {
                running.retain(|r| r.id != id);
                announce(started, &finished, done.len() + 1, total);
                done.push(finished);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                say(started, &still_running(&running, done.len(), total));
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    done
}

/// A file name for a job's log: its label's letters and digits.
fn log_name(label: &str) -> String {
    let name: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("{}.log", name.trim_matches('-'))
}

fn say(started: Instant, what: &str) {
    let s = started.elapsed().as_secs();
    println!("[{:02}:{:02}] {what}", s / 60, s % 60);
}

fn still_running(running: &[Running], done: usize, total: usize) -> String {
    let names: Vec<String> = running
        .iter()
        .map(|r| {
            let s = r.since.elapsed().as_secs();
            format!("{} {}m{:02}s", r.label, s / 60, s % 60)
        })
        .collect();
    format!("running  {} ({done} of {total} done)", names.join(", "))
}

fn announce(started: Instant, f: &Finished, n: usize, total: usize) {
    let c = f.counts;
    let figures = figures(f);
    let summary = format!(
        "{:.1} s, CPU {:.0}%, {} passed, {} failed, {} ignored ({n} of {total} done)",
        f.seconds,
        figures.cpu * 100.0,
        c.passed,
        c.failed,
        c.ignored
    );
    if f.ok {
        say(started, &format!("ok       {}: {summary}", f.label));
    } else {
        say(
            started,
            &format!(
                "FAILED   {}: {}; {summary}; its log: {}",
                f.label,
                f.ended,
                f.log.display()
            ),
        );
        let log = std::fs::read_to_string(&f.log).unwrap_or_default();
        println!(
            "──── {} ────\n{}\n──── end of {} ────",
            f.label,
            job::failure_excerpt(&log),
            f.label
        );
    }
}

fn print_table(rows: &[(String, Figures)], seconds: f64, busy: Option<f64>, limits: Limits) {
    println!();
    println!(
        "test time by binary, slowest first (seconds, the share of the machine's CPUs its processes used, \
         and the most inotify instances they held):"
    );
    let mut sorted: Vec<&(String, Figures)> = rows.iter().collect();
    sorted.sort_by(|a, b| b.1.seconds.total_cmp(&a.1.seconds));
    for (label, f) in &sorted {
        println!(
            "  {:8.1}  {:3.0}%  {:4}  {label}",
            f.seconds,
            f.cpu * 100.0,
            f.inotify
        );
    }
    let sum: f64 = rows.iter().map(|r| r.1.seconds).sum();
    let busy = busy.map_or("-".to_string(), |b| format!("{:.0}%", b * 100.0));
    println!(
        "  {seconds:8.1}  {busy:>4}        in all: {} binaries, at most {} at once within {:.0}% of the CPUs \
         and {} inotify instances (one after another they would take {sum:.1} s); the CPU column \
         here is the whole machine's",
        rows.len(),
        limits.jobs,
        limits.cpu * 100.0,
        limits.inotify
    );
}

fn print_totals(finished: &[Finished]) {
    let mut counts = Counts::default();
    let mut left = [0u64; 3];
    for f in finished {
        counts += f.counts;
        for (sum, n) in left.iter_mut().zip(f.left.unwrap_or_default()) {
            *sum += n;
        }
    }
    println!(
        "tests: {} passed, {} failed, {} ignored",
        counts.passed, counts.failed, counts.ignored
    );
    if finished.iter().any(|f| f.left.is_some()) {
        println!(
            "left behind, all binaries: {} processes, {} cgroups, {} network namespaces",
            left[0], left[1], left[2]
        );
    }
    for f in finished.iter().filter(|f| !f.ok) {
        println!(
            "failed: {} ({}; its log: {})",
            f.label,
            f.ended,
            f.log.display()
        );
    }
}

/// The machine's CPU ticks, busy and in all, from `/proc/stat`.
struct Machine(Option<(u64, u64)>);

impl Machine {
    fn now() -> Machine {
        Machine(ticks())
    }

    /// How busy the machine's CPUs were since this was taken, 1.0 for all of them.
    fn busy_since(&self) -> Option<f64> {
        let (busy0, all0) = self.0?;
        let (busy1, all1) = ticks()?;
        let all = all1.checked_sub(all0).filter(|t| *t > 0)?;
        Some(busy1.saturating_sub(busy0) as f64 / all as f64)
    }
}

fn ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
    let n: Vec<u64> = cpu
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: idle and iowait are not busy.
    let all: u64 = n.iter().take(8).sum();
    let idle = n.get(3)? + n.get(4)?;
    Some((all - idle, all))
}

#[cfg(test)]
mod tests;
