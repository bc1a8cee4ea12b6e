//! The suite's scheduling, tables and history, as pure functions.

use super::*;

fn f(seconds: f64, cpu: f64) -> Figures {
    Figures {
        seconds,
        cpu,
        inotify: 0,
    }
}

fn with_inotify(seconds: f64, inotify: u32) -> Figures {
    Figures {
        seconds,
        cpu: 0.2,
        inotify,
    }
}

const LIMITS: Limits = Limits {
    jobs: 3,
    cpu: 1.0,
    inotify: 124,
};

#[test]
fn jobs_start_longest_first_while_their_cpu_fits() {
    let limits = LIMITS;
    let pending = [f(460.0, 0.36), f(280.0, 0.81), f(230.0, 0.45), f(50.0, 0.1)];
    assert_eq!(pick(&pending, &[], limits), Some(0));
    // Beside a 36% job ending in 400 s, the 81% one waits; the next that fits and ends by
    // then starts.
    let rest = &pending[1..];
    assert_eq!(pick(rest, &[f(400.0, 0.36)], limits), Some(1));
    assert_eq!(
        pick(
            &[rest[0], rest[2]],
            &[f(400.0, 0.36), f(200.0, 0.45)],
            limits
        ),
        Some(1)
    );
    assert_eq!(pick(rest, &[f(100.0, 0.95)], limits), None);
    // However busy a job was, it starts when nothing else runs.
    assert_eq!(pick(&[f(10.0, 1.7)], &[], limits), Some(0));
    // Never more than the limit of jobs.
    let three = [f(9.0, 0.1), f(9.0, 0.1), f(9.0, 0.1)];
    assert_eq!(pick(&pending, &three, limits), None);
    assert_eq!(pick(&[], &[], limits), None);
}

#[test]
fn a_shorter_job_never_takes_the_room_the_longest_waits_for() {
    let limits = LIMITS;
    // The 64% job fits once the 40% one ends, in 60 s: a 300 s job of 20% would keep it
    // waiting, a 50 s one may run meanwhile.
    let running = [f(600.0, 0.15), f(60.0, 0.4)];
    assert_eq!(
        pick(&[f(300.0, 0.64), f(300.0, 0.2)], &running, limits),
        None
    );
    assert_eq!(
        pick(
            &[f(300.0, 0.64), f(300.0, 0.2), f(50.0, 0.2)],
            &running,
            limits
        ),
        Some(2)
    );
    // A job that can never fit beside the running ones leaves every job that fits free.
    assert_eq!(
        pick(&[f(300.0, 0.9), f(300.0, 0.2)], &[f(600.0, 0.15)], limits),
        Some(1)
    );
}

#[test]
fn binaries_with_real_nodes_never_hold_more_inotify_instances_than_are_free() {
    // Two binaries with a real node hold 94 of 124: a third waits, a binary without one
    // starts beside them.
    let running = [with_inotify(300.0, 47), with_inotify(200.0, 47)];
    assert_eq!(pick(&[with_inotify(100.0, 47)], &running, LIMITS), None);
    assert_eq!(
        pick(
            &[with_inotify(300.0, 47), with_inotify(100.0, 2)],
            &running,
            LIMITS
        ),
        Some(1)
    );
    // A short one with a node may start meanwhile only if it fits and ends before room is
    // made for the first.
    let three = [with_inotify(400.0, 80), with_inotify(10.0, 30)];
    assert_eq!(pick(&three, &[with_inotify(50.0, 60)], LIMITS), Some(1));
    // Alone, a binary runs however many it needs.
    assert_eq!(pick(&[with_inotify(10.0, 500)], &[], LIMITS), Some(0));
}

#[test]
fn a_share_measured_on_a_saturated_machine_never_lowers_the_kept_one() {
    let before = Some(f(380.0, 0.53));
    // Starved: longer, and a smaller share of the machine than it needs.
    let starved = f(532.0, 0.40);
    assert_eq!(to_keep(starved, Some(0.99), before), f(532.0, 0.53));
    // With CPUs to spare, the share is what the job needs, lower or higher.
    assert_eq!(to_keep(starved, Some(0.70), before), starved);
    assert_eq!(to_keep(f(300.0, 0.60), Some(0.99), before), f(300.0, 0.60));
    // Nothing kept before, or the machine not read: as measured.
    assert_eq!(to_keep(starved, Some(0.99), None), starved);
    assert_eq!(to_keep(starved, None, before), starved);
}

#[test]
fn a_job_never_seen_runs_first() {
    let history = history::parse("459.4\t36%\tsync (tests/sync/main.rs)\n");
    assert_eq!(
        estimate(&history, "sync (tests/sync/main.rs)"),
        Figures {
            seconds: 459.4,
            cpu: 0.36,
            inotify: history::UNKNOWN_INOTIFY
        }
    );
    assert!(
        estimate(&history, "new (tests/new.rs)")
            .seconds
            .is_infinite()
    );
}

#[test]
fn arguments_split_into_limits_cargo_and_the_binaries() {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let parsed = parse_args(&args(&[
        "--jobs",
        "4",
        "--cpu",
        "120",
        "--inotify-limit",
        "512",
        "--isolate",
        "testenv/isolated.sh",
        "--",
        "--workspace",
        "--",
        "--test-threads=4",
    ]))
    .expect("good arguments");
    assert_eq!(parsed.limits.jobs, 4);
    assert_eq!(parsed.limits.cpu, 1.2);
    assert_eq!(parsed.inotify_limit, Some(512));
    assert_eq!(
        parse_args(&args(&["--inotify-limit", "many"])).err(),
        Some(ArgsError::InotifyLimit("many".into()))
    );
    assert_eq!(parsed.isolate, Some(PathBuf::from("testenv/isolated.sh")));
    assert_eq!(parsed.cargo_args, ["--workspace"]);
    assert_eq!(parsed.test_args, ["--test-threads=4"]);
    assert_eq!(
        parse_args(&args(&["--jobs", "0"])).err(),
        Some(ArgsError::Jobs("0".into()))
    );
    assert_eq!(
        parse_args(&args(&["--cpu"])).err(),
        Some(ArgsError::MissingValue("--cpu".into()))
    );
    assert_eq!(
        parse_args(&args(&["--fast"])).err(),
        Some(ArgsError::Unknown("--fast".into()))
    );
}

#[test]
fn log_names_are_plain() {
    assert_eq!(
        log_name("sync (tests/sync/main.rs)"),
        "sync--tests-sync-main-rs.log"
    );
    assert_eq!(log_name("doc tests"), "doc-tests.log");
}
