//! `make bench-snapshot SIZE_MIB=1024`: one snapshot of a kine-shaped sqlite database of
//! SIZE_MIB MiB (default 1024), taken the way the operator takes one: the snapshot agent
//! (`tenantplane agent`, as its own process) copies the database online and streams it over
//! mutual TLS; the operator's code hashes it and uploads it to a real S3 store (SeaweedFS on
//! loopback) in parts. A writer keeps committing to the database throughout. Prints the time,
//! the throughput, and the peak memory of the agent and of the uploading side, which streams:
//! neither may hold the snapshot. A benchmark prints figures; it asserts only that the work was
//! done (the stored bytes' hash is the agent's).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use rusqlite::Connection;
use tenantplane_api::SnapshotStoreSpec;
use tenantplane_api::snapshot::{S3Location, SecretRef};
use tenantplane_controller::snapshot::store::{ACCESS_KEY_ID, SECRET_ACCESS_KEY, Store};
use tenantplane_controller::snapshot::{agent_client, copy};
use tenantplane_controller::tenant_pki::{self, TenantPki};
use tenantplane_testenv::binaries::Binaries;
use tenantplane_testenv::s3::S3Server;

fn say(started: Instant, line: &str) {
    eprintln!("[{:>5.1}s] {line}", started.elapsed().as_secs_f64());
}

/// A memory figure (`VmRSS`, `VmHWM`) of a process from `/proc/<pid>/status`, in MiB.
fn memory_mib(pid: &str, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with(field))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .unwrap_or(0.0)
        / 1024.0
}

/// A database shaped like kine's (one table of keys and values), grown to `mib` MiB of rows of
/// 4 KiB values, in WAL mode as kine runs it.
fn grow(path: &Path, mib: u64, started: Instant) -> anyhow::Result<()> {
    let db = Connection::open(path)?;
    db.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
         CREATE TABLE kine (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, value BLOB);
         CREATE INDEX kine_name_index ON kine (name);",
    )?;
    let rows = mib * 256;
    let mut done = 0;
    while done < rows {
        let tx = db.unchecked_transaction()?;
        {
            let mut insert =
                tx.prepare("INSERT INTO kine (name, value) VALUES (?1, randomblob(4096))")?;
            for i in done..(done + 2048).min(rows) {
                insert.execute([format!("/registry/configmaps/bench/object-{i}")])?;
            }
        }
        tx.commit()?;
        done = (done + 2048).min(rows);
        if done % (64 * 256) == 0 {
            say(
                started,
                &format!("database: {} of {mib} MiB written", done / 256),
            );
        }
    }
    db.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mib: u64 = std::env::var("SIZE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let started = Instant::now();
    let dir =
        std::env::temp_dir().join(format!("tenantplane-bench-snapshot-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("db"))?;
    let database = dir.join("db").join("state.db");
    say(
        started,
        &format!("growing a {mib} MiB kine-shaped database"),
    );
    grow(&database, mib, started)?;
    let on_disk = std::fs::metadata(&database)?.len();

    // The tenant's PKI, as the pod mounts it.
    let pki = TenantPki::generate("bench")?;
    let pki_dir = dir.join("pki");
    std::fs::create_dir_all(&pki_dir)?;
    std::fs::write(
        pki_dir.join(tenant_pki::SERVER_CA_CRT),
        pki.server_ca.cert_pem(),
    )?;
    std::fs::write(
        pki_dir.join(tenant_pki::SERVER_CA_KEY),
        pki.server_ca.key_pem(),
    )?;
    std::fs::write(
        pki_dir.join(tenant_pki::CLIENT_CA_CRT),
        pki.client_ca.cert_pem(),
    )?;

    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let address = format!("127.0.0.1:{port}");
    let mut agent = tokio::process::Command::new(env!("CARGO_BIN_EXE_tenantplane"))
        .args([
            "agent".to_string(),
            format!("--listen={address}"),
            format!("--database={}", database.display()),
            format!("--pki={}", pki_dir.display()),
            format!("--scratch={}", dir.join("scratch").display()),
        ])
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .context("starting the snapshot agent")?;
    let agent_pid = agent.id().context("the agent exited at once")?.to_string();

    say(started, "starting the S3 store (SeaweedFS on loopback)");
    let binaries = Binaries::locate()?;
    let s3 = S3Server::start(&binaries, &dir.join("s3")).await?;
    s3.create_bucket("bench").await?;
    let spec = SnapshotStoreSpec {
        s3: S3Location {
            endpoint: s3.endpoint.clone(),
            bucket: "bench".into(),
            prefix: String::new(),
            region: "us-east-1".into(),
            ca_bundle: None,
        },
        credentials_secret_ref: SecretRef {
            name: "bench".into(),
        },
        default: false,
    };
    let mut secret = Secret::default();
    secret.metadata.name = Some("bench".into());
    secret.data = Some(
        [
            (
                ACCESS_KEY_ID.to_string(),
                ByteString(s3.access_key.clone().into_bytes()),
            ),
            (
                SECRET_ACCESS_KEY.to_string(),
                ByteString(s3.secret_key.clone().into_bytes()),
            ),
        ]
        .into(),
    );
    let store = Store::connect(&spec, &secret).map_err(anyhow::Error::msg)?;
    let objects = store.objects("bench", "bench", "bench", "1");

    // A writer commits throughout, as kine does under a busy tenant.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, path) = (stop.clone(), database.clone());
        std::thread::spawn(move || -> anyhow::Result<u64> {
            let db = Connection::open(&path)?;
            db.busy_timeout(Duration::from_secs(30))?;
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                db.execute(
                    "INSERT INTO kine (name, value) VALUES (?1, randomblob(512))",
                    [format!("/registry/configmaps/bench/during-{n}")],
                )?;
                n += 1;
            }
            Ok(n)
        })
    };
    let own_before = memory_mib("self", "VmRSS:");
    // This process's resident memory, sampled while the bytes pass (its high-water mark would
    // count the database growth above).
    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        std::thread::spawn(move || {
            let mut peak: f64 = 0.0;
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(memory_mib("self", "VmRSS:"));
                std::thread::sleep(Duration::from_millis(50));
            }
            peak
        })
    };
    say(started, "taking the snapshot: agent → operator → store");
    let began = Instant::now();
    let download = agent_client::download(&address, &pki)
        .await
        .map_err(anyhow::Error::msg)?;
    let copied_in = began.elapsed();
    let agent_sha = download.sha256.clone();
    let (size, sha) = store
        .upload(&objects.data, download.bytes)
        .await
        .map_err(anyhow::Error::msg)?;
    let took = began.elapsed();
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let own_peak = sampler.join().unwrap_or(0.0);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written_during = writer
        .join()
        .map_err(|_| anyhow::anyhow!("the writer panicked"))??;
    if sha != agent_sha {
        bail!("the store got sha256:{sha}, the agent sent sha256:{agent_sha}");
    }
    let agent_peak = memory_mib(&agent_pid, "VmHWM:");
    let _ = agent.kill().await;
    s3.stop();
    let _ = std::fs::remove_dir_all(&dir);

    println!(
        "snapshot of a {mib} MiB database ({:.0} MiB on disk, {written_during} rows committed during the copy)",
        on_disk as f64 / 1048576.0
    );
    println!(
        "  stored {:.0} MiB in {:.1}s ({:.0} MiB/s); the agent's online copy, check and hash took {:.1}s before the first byte",
        size as f64 / 1048576.0,
        took.as_secs_f64(),
        size as f64 / 1048576.0 / took.as_secs_f64(),
        copied_in.as_secs_f64()
    );
    println!("  checksum {}", copy::checksum_text(&sha));
    println!(
        "  peak memory: the agent {agent_peak:.0} MiB (its whole life); the operator's side {own_peak:.0} MiB while the bytes passed ({own_before:.0} MiB before)"
    );
    Ok(())
}
