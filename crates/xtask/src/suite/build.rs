//! Build the test binaries through cargo (`--no-run`, its progress on the terminal) and make a
//! [`Job`] of each, named as cargo names it when it runs them; plus one job for the doc tests.

use std::ffi::{OsStr, OsString};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::job::Job;

/// Why the binaries could not be built or listed.
#[derive(Debug)]
pub enum BuildError {
    /// cargo could not be started or read.
    Cargo(std::io::Error),
    /// cargo ran and failed (its errors are on the terminal already).
    Failed(std::process::ExitStatus),
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildError::Cargo(e) => write!(f, "running cargo: {e}"),
            BuildError::Failed(status) => write!(f, "building the tests failed ({status})"),
        }
    }
}

/// How every job runs.
pub struct Plan<'a> {
    pub cargo: &'a OsStr,
    /// Arguments of `cargo test` (package and target selection, `--locked`, `--offline`).
    pub cargo_args: &'a [String],
    /// Arguments of each test binary (`--test-threads=4`, a filter).
    pub test_args: &'a [String],
    /// A script that runs each binary in namespaces of its own (`testenv/isolated.sh`).
    pub isolate: Option<&'a Path>,
}

/// Build the test binaries and return a job for each, and for the doc tests when libraries are
/// selected.
pub fn jobs(plan: &Plan) -> Result<Vec<Job>, BuildError> {
    let mut child = Command::new(plan.cargo)
        .arg("test")
        .args(plan.cargo_args)
        .args(["--no-run", "--message-format=json-render-diagnostics"])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(BuildError::Cargo)?;
    let mut jobs = Vec::new();
    if let Some(out) = child.stdout.take() {
        for line in std::io::BufReader::new(out).lines() {
            let line = line.map_err(BuildError::Cargo)?;
            if let Some(artifact) = TestArtifact::from_message(&line) {
                jobs.push(artifact.job(plan));
            }
        }
    }
    let status = child.wait().map_err(BuildError::Cargo)?;
    if !status.success() {
        return Err(BuildError::Failed(status));
    }
    jobs.extend(doc_tests(plan));
    Ok(jobs)
}

/// A test binary cargo built, from its `compiler-artifact` message.
#[derive(Debug, PartialEq)]
struct TestArtifact {
    name: String,
    kind: String,
    src_path: PathBuf,
    executable: PathBuf,
    package_dir: PathBuf,
}

impl TestArtifact {
    fn from_message(line: &str) -> Option<TestArtifact> {
        let m: serde_json::Value = serde_json::from_str(line).ok()?;
        if m["reason"] != "compiler-artifact" || m["profile"]["test"] != true {
            return None;
        }
        let target = &m["target"];
        Some(TestArtifact {
            name: target["name"].as_str()?.replace('-', "_"),
            kind: target["kind"][0].as_str()?.to_string(),
            src_path: PathBuf::from(target["src_path"].as_str()?),
            executable: PathBuf::from(m["executable"].as_str()?),
            package_dir: Path::new(m["manifest_path"].as_str()?)
                .parent()?
                .to_path_buf(),
        })
    }

    /// As cargo's `Running …` line says: `sync (tests/sync/main.rs)` for an integration test,
    /// `tenantplane_api (unittests src/lib.rs)` for a crate's own tests.
    fn label(&self) -> String {
        let src = self
            .src_path
            .strip_prefix(&self.package_dir)
            .unwrap_or(&self.src_path);
        match self.kind.as_str() {
            "test" => format!("{} ({})", self.name, src.display()),
            _ => format!("{} (unittests {})", self.name, src.display()),
        }
    }

    fn job(&self, plan: &Plan) -> Job {
        let mut args: Vec<OsString> = plan.test_args.iter().map(OsString::from).collect();
        let program = match plan.isolate {
            Some(script) => {
                let mut wrapped = vec![
                    script.as_os_str().to_owned(),
                    self.executable.clone().into(),
                ];
                wrapped.append(&mut args);
                args = wrapped;
                OsString::from("bash")
            }
            None => self.executable.clone().into(),
        };
        Job {
            label: self.label(),
            program,
            args,
            dir: self.package_dir.clone(),
        }
    }
}

/// `cargo test --doc` with the run's package selection, unless the run selects targets that
/// leave the libraries out (`--test NAME` alone, `--bins`).
fn doc_tests(plan: &Plan) -> Option<Job> {
    const TARGETS: [&str; 7] = [
        "--lib",
        "--bins",
        "--bin",
        "--tests",
        "--test",
        "--examples",
        "--benches",
    ];
    let selects = |flag: &str| plan.cargo_args.iter().any(|a| a == flag);
    if TARGETS.iter().any(|t| selects(t)) && !selects("--lib") {
        return None;
    }
    let mut args: Vec<OsString> = vec!["test".into(), "--doc".into()];
    let mut skip_value = false;
    for a in plan.cargo_args {
        if skip_value {
            skip_value = false;
            continue;
        }
        match a.as_str() {
            "--bin" | "--test" | "--example" | "--bench" => skip_value = true,
            a if TARGETS.contains(&a) || a == "--no-fail-fast" => {}
            a => args.push(a.into()),
        }
    }
    Some(Job {
        label: "doc tests".to_string(),
        program: plan.cargo.to_owned(),
        args,
        dir: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MESSAGE: &str = r#"{"reason":"compiler-artifact","manifest_path":"/w/crates/tenantplane/Cargo.toml","target":{"kind":["test"],"name":"sync","src_path":"/w/crates/tenantplane/tests/sync/main.rs"},"profile":{"test":true},"executable":"/t/debug/deps/sync-d0dd"}"#;

    fn plan<'a>(cargo_args: &'a [String], isolate: Option<&'a Path>) -> Plan<'a> {
        Plan {
            cargo: OsStr::new("cargo"),
            cargo_args,
            test_args: &[],
            isolate,
        }
    }

    #[test]
    fn a_test_artifact_becomes_a_job_named_as_cargo_names_it() {
        let artifact = TestArtifact::from_message(MESSAGE).expect("a test artifact");
        assert_eq!(artifact.label(), "sync (tests/sync/main.rs)");
        let unit = MESSAGE
            .replace(r#"["test"]"#, r#"["lib"]"#)
            .replace("tests/sync/main.rs", "src/lib.rs")
            .replace(r#""name":"sync""#, r#""name":"tenantplane-api""#);
        let unit = TestArtifact::from_message(&unit).expect("a lib test artifact");
        assert_eq!(unit.label(), "tenantplane_api (unittests src/lib.rs)");
        let script = Path::new("/w/testenv/isolated.sh");
        let job = artifact.job(&plan(&[], Some(script)));
        assert_eq!(job.program, "bash");
        assert_eq!(
            job.args,
            vec![
                OsString::from("/w/testenv/isolated.sh"),
                "/t/debug/deps/sync-d0dd".into()
            ]
        );
        assert_eq!(job.dir, Path::new("/w/crates/tenantplane"));
    }

    #[test]
    fn other_messages_are_not_jobs() {
        assert_eq!(TestArtifact::from_message("not json"), None);
        let not_test = MESSAGE.replace(r#""test":true"#, r#""test":false"#);
        assert_eq!(TestArtifact::from_message(&not_test), None);
        let no_exe = MESSAGE.replace(r#""/t/debug/deps/sync-d0dd""#, "null");
        assert_eq!(TestArtifact::from_message(&no_exe), None);
    }

    #[test]
    fn doc_tests_follow_the_package_selection() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let all = args(&["--workspace", "--locked", "--no-fail-fast"]);
        let job = doc_tests(&plan(&all, None)).expect("doc tests of every library");
        assert_eq!(
            job.args,
            vec![
                OsString::from("test"),
                "--doc".into(),
                "--workspace".into(),
                "--locked".into()
            ]
        );
        let unit = args(&["--workspace", "--lib", "--bins", "--test", "admission"]);
        let job = doc_tests(&plan(&unit, None)).expect("--lib keeps the doc tests");
        assert_eq!(
            job.args,
            vec![OsString::from("test"), "--doc".into(), "--workspace".into()]
        );
        let one = args(&["-p", "tenantplane", "--test", "sync"]);
        assert!(doc_tests(&plan(&one, None)).is_none());
    }
}
