//! `xtask`: checks of the workspace's own shape, which `make lint` runs.
//!
//! - `xtask circles [ROOT]`: every crate under `ROOT/crates` (default: the workspace) has no
//!   import circle between its modules ([`circles`]); each circle is printed with the lines that
//!   make it, and the exit code is 1.
//! - `xtask suite [--jobs N] [--cpu PERCENT] [--isolate SCRIPT] [-- CARGO_ARGS… [-- TEST_ARGS…]]`:
//!   build the test binaries and run them, several at once as they fit, with a table of their
//!   times at the end ([`suite`]); `make test` and `make unit` run it.

mod circles;
mod suite;

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("circles") => {
            let root = args
                .get(1)
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."));
            check_circles(&root)
        }
        Some("suite") => suite::main(&args[1..]),
        _ => {
            eprintln!(
                "usage: xtask circles [ROOT]   (no import circle between a crate's modules)\n       \
                 xtask suite [--jobs N] [--cpu PERCENT] [--isolate SCRIPT] [-- CARGO_ARGS… [-- TEST_ARGS…]]"
            );
            ExitCode::from(2)
        }
    }
}

fn check_circles(root: &std::path::Path) -> ExitCode {
    let crates = root.join("crates");
    let mut names: Vec<PathBuf> = match std::fs::read_dir(&crates) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join("src").is_dir())
            .collect(),
        Err(e) => {
            eprintln!("xtask circles: reading {}: {e}", crates.display());
            return ExitCode::from(2);
        }
    };
    names.sort();
    let mut total = 0;
    for dir in &names {
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        let found = match circles::of_crate(&dir.join("src")) {
            Ok(found) => found,
            Err(e) => {
                eprintln!("xtask circles: {e}");
                return ExitCode::from(2);
            }
        };
        for circle in &found {
            let modules: Vec<String> = circle.modules.iter().map(show).collect();
            println!(
                "import circle in crates/{name}: {} modules: {}",
                modules.len(),
                modules.join(", ")
            );
            for u in &circle.uses {
                let file = u.file.strip_prefix(root).unwrap_or(&u.file);
                println!(
                    "  {} → {}  ({}:{})",
                    show(&u.from),
                    show(&u.to),
                    file.display(),
                    u.line
                );
            }
        }
        total += found.len();
    }
    if total == 0 {
        println!("import circles: none in {} crates", names.len());
        ExitCode::SUCCESS
    } else {
        println!(
            "import circles: {total}; break each by moving what both sides need below them both"
        );
        ExitCode::FAILURE
    }
}

fn show(module: &circles::ModulePath) -> String {
    if module.is_empty() {
        "crate".to_string()
    } else {
        module.join("::")
    }
}
