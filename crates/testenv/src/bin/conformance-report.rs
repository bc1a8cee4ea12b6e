//! `conformance-report HOST.json[,MORE.json…] TENANT.json[,MORE.json…]`: the table and parity
//! line of `make conformance`, from each side's ginkgo JSON reports (a side runs in parts: a spec
//! a later part ran counts as that part says).

use std::process::ExitCode;

use tenantplane_testenv::conformance;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [host, tenant] = args.as_slice() else {
        eprintln!(
            "usage: conformance-report HOST.json[,MORE.json…] TENANT.json[,MORE.json…] \
             (ginkgo --json-report files)"
        );
        return ExitCode::from(2);
    };
    let read = |paths: &str| {
        let mut all = std::collections::BTreeMap::new();
        for path in paths.split(',') {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
            all.extend(conformance::outcomes(&text).map_err(|e| format!("{path}: {e}"))?);
        }
        Ok::<_, String>(all)
    };
    match (read(host), read(tenant)) {
        (Ok(h), Ok(t)) => {
            print!("{}", conformance::report(&h, &t));
            ExitCode::SUCCESS
        }
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("conformance-report: {e}");
            ExitCode::FAILURE
        }
    }
}
