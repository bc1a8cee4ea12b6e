//! `conformance-report HOST.json TENANT.json`: the table and parity line of `make conformance`,
//! from the two ginkgo JSON reports.

use std::process::ExitCode;

use tenantplane_testenv::conformance;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [host, tenant] = args.as_slice() else {
        eprintln!("usage: conformance-report HOST.json TENANT.json (ginkgo --json-report files)");
        return ExitCode::from(2);
    };
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map_err(|e| format!("{path}: {e}"))
            .and_then(|text| conformance::outcomes(&text).map_err(|e| format!("{path}: {e}")))
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
