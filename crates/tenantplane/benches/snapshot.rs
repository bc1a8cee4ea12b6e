//! `make bench-snapshot`: snapshots and restores the way the operator makes them. The snapshot
//! agent (`tenantplane agent`, as its own process) copies a kine-shaped sqlite database online
//! and streams it over mutual TLS; the operator's code hashes it and uploads it to a real S3
//! store (SeaweedFS on loopback) in parts, while a writer keeps committing to the database. Then
//! the restore: a second agent, as the restore init container (`--restore`), receives the object
//! streamed back from the store, checks it and puts it in place.
//!
//! `OBJECTS=1000,10000,50000` (the default) makes one database per count, each object a
//! ConfigMap-sized value (2 KiB) with three revisions, as kine keeps them; `SIZE_MIB=1024` makes
//! one database of that size of 4 KiB rows instead. Prints, per database, the snapshot's and the
//! restore's time, and the peak memory of the agents and of the operator's side, which streams:
//! none may hold the snapshot. A benchmark prints figures; it asserts only that the work was done
//! (the stored and the restored bytes' hashes are the agent's).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
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
    fill(path, mib * 256, 1, 4096, started)
}

/// A kine-shaped database of `objects` objects, each with `revisions` rows of `bytes` bytes.
fn fill(
    path: &Path,
    objects: u64,
    revisions: u64,
    bytes: u64,
    started: Instant,
) -> anyhow::Result<()> {
    let db = Connection::open(path)?;
    db.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
         CREATE TABLE kine (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, value BLOB);
         CREATE INDEX kine_name_index ON kine (name);",
    )?;
    let rows = objects * revisions;
    let mut done = 0;
    while done < rows {
        let tx = db.unchecked_transaction()?;
        {
            let mut insert =
                tx.prepare("INSERT INTO kine (name, value) VALUES (?1, randomblob(?2))")?;
            for i in done..(done + 2048).min(rows) {
                insert.execute(rusqlite::params![
                    format!("/registry/configmaps/bench/object-{}", i % objects),
                    bytes as i64
                ])?;
            }
        }
        tx.commit()?;
        done = (done + 2048).min(rows);
        if done % (256 * 1024) < 2048 {
            say(started, &format!("  {done} of {rows} rows"));
        }
    }
    Ok(())
}

/// The peak resident memory of process `pid` (MiB), sampled until `running` is cleared.
fn sample_peak(pid: String, running: Arc<AtomicBool>) -> std::thread::JoinHandle<f64> {
    std::thread::spawn(move || {
        let mut peak: f64 = 0.0;
        while running.load(Ordering::Relaxed) {
            peak = peak.max(memory_mib(&pid, "VmRSS:"));
            std::thread::sleep(Duration::from_millis(20));
        }
        peak
    })
}

/// An agent process on a free loopback port: the process, its address and its pid.
async fn agent(
    dir: &Path,
    database: &Path,
    pki_dir: &Path,
    restore: Option<&str>,
) -> anyhow::Result<(tokio::process::Child, String, String)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let address = format!("127.0.0.1:{port}");
    let mut args = vec![
        "agent".to_string(),
        format!("--listen={address}"),
        format!("--database={}", database.display()),
        format!("--pki={}", pki_dir.display()),
        format!("--scratch={}", dir.join("scratch").display()),
    ];
    if let Some(id) = restore {
        args.push(format!("--restore={id}"));
    }
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tenantplane"))
        .args(args)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .context("starting the snapshot agent")?;
    let pid = child.id().context("the agent exited at once")?.to_string();
    // Listening once it answers a TCP connect.
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(&address).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Ok((child, address, pid))
}

/// How one database of the run is made.
type Grow = Box<dyn Fn(&Path) -> anyhow::Result<()>>;

/// What one database's snapshot and restore measured.
struct Figures {
    label: String,
    on_disk: u64,
    written_during: u64,
    size: u64,
    first_byte: Duration,
    stored_in: Duration,
    agent_peak: f64,
    operator_peak: f64,
    operator_before: f64,
    restored_in: Duration,
    restore_agent_peak: f64,
    restore_operator_peak: f64,
}

/// Snapshot `database` into the store and restore it into a fresh claim.
async fn measure(
    label: String,
    dir: &Path,
    database: &Path,
    pki: &TenantPki,
    pki_dir: &Path,
    store: &Store,
    started: Instant,
) -> anyhow::Result<Figures> {
    let on_disk = std::fs::metadata(database)?.len();
    let (mut snap_agent, address, agent_pid) = agent(dir, database, pki_dir, None).await?;
    let objects = store.objects("bench", "bench", &label, "1");
    // A writer commits throughout, as kine does under a busy tenant.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, path) = (stop.clone(), database.to_path_buf());
        std::thread::spawn(move || -> anyhow::Result<u64> {
            let db = Connection::open(&path)?;
            db.busy_timeout(Duration::from_secs(30))?;
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                db.execute(
                    "INSERT INTO kine (name, value) VALUES (?1, randomblob(512))",
                    [format!("/registry/configmaps/bench/during-{n}")],
                )?;
                n += 1;
            }
            Ok(n)
        })
    };
    let operator_before = memory_mib("self", "VmRSS:");
    // This process's resident memory, sampled while the bytes pass (its high-water mark would
    // count the database growth above).
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = sample_peak(std::process::id().to_string(), sampling.clone());
    say(
        started,
        &format!("{label}: snapshot, agent → operator → store"),
    );
    let began = Instant::now();
    let download = agent_client::download(&address, pki)
        .await
        .map_err(anyhow::Error::msg)?;
    let first_byte = began.elapsed();
    let agent_sha = download.sha256.clone();
    let (size, sha) = store
        .upload(&objects.data, download.bytes)
        .await
        .map_err(anyhow::Error::msg)?;
    let stored_in = began.elapsed();
    sampling.store(false, Ordering::Relaxed);
    let operator_peak = sampler.join().unwrap_or(0.0);
    stop.store(true, Ordering::Relaxed);
    let written_during = writer
        .join()
        .map_err(|_| anyhow::anyhow!("the writer panicked"))??;
    if sha != agent_sha {
        bail!("the store got sha256:{sha}, the agent sent sha256:{agent_sha}");
    }
    let agent_peak = memory_mib(&agent_pid, "VmHWM:");
    let _ = snap_agent.kill().await;

    // The restore: an init container's agent on a claim of its own, the object streamed back.
    say(
        started,
        &format!("{label}: restore, store → operator → agent"),
    );
    let target = dir.join(format!("restore-{label}")).join("state.db");
    let (mut restore_agent, address, pid) = agent(dir, &target, pki_dir, Some("bench")).await?;
    let watching = Arc::new(AtomicBool::new(true));
    let restore_sampler = sample_peak(pid, watching.clone());
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = sample_peak(std::process::id().to_string(), sampling.clone());
    let began = Instant::now();
    let bytes = store
        .download(&objects.data)
        .await?
        .map_err(std::io::Error::other)
        .boxed();
    agent_client::upload(&address, pki, &sha, size, bytes)
        .await
        .map_err(anyhow::Error::msg)?;
    let restored_in = began.elapsed();
    sampling.store(false, Ordering::Relaxed);
    let restore_operator_peak = sampler.join().unwrap_or(0.0);
    let exited = tokio::time::timeout(Duration::from_secs(30), restore_agent.wait()).await;
    watching.store(false, Ordering::Relaxed);
    let restore_agent_peak = restore_sampler.join().unwrap_or(0.0);
    if !matches!(exited, Ok(Ok(status)) if status.success()) {
        bail!("the restoring agent did not finish: {exited:?}");
    }
    let (restored_size, restored_sha) = copy::hash_file(&target).map_err(anyhow::Error::msg)?;
    if restored_size != size {
        bail!("restored {restored_size} bytes, stored {size}");
    }
    let _ = restored_sha;
    let _ = std::fs::remove_dir_all(target.parent().unwrap_or(dir));
    Ok(Figures {
        label,
        on_disk,
        written_during,
        size,
        first_byte,
        stored_in,
        agent_peak,
        operator_peak,
        operator_before,
        restored_in,
        restore_agent_peak,
        restore_operator_peak,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let size_mib: Option<u64> = std::env::var("SIZE_MIB").ok().and_then(|v| v.parse().ok());
    let counts: Vec<u64> = std::env::var("OBJECTS")
        .unwrap_or_else(|_| "1000,10000,50000".into())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    let started = Instant::now();
    let dir =
        std::env::temp_dir().join(format!("tenantplane-bench-snapshot-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;

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
        encryption: None,
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

    let mut figures = Vec::new();
    let cases: Vec<(String, Grow)> = match size_mib {
        Some(mib) => vec![(
            format!("{mib}MiB"),
            Box::new(move |path: &Path| grow(path, mib, started)),
        )],
        None => counts
            .iter()
            .map(|&n| {
                let grow: Grow = Box::new(move |path: &Path| fill(path, n, 3, 2048, started));
                (format!("{n}objects"), grow)
            })
            .collect(),
    };
    for (label, make) in cases {
        let database = dir.join(&label).join("state.db");
        std::fs::create_dir_all(database.parent().unwrap_or(&dir))?;
        say(started, &format!("{label}: growing a kine-shaped database"));
        make(&database)?;
        figures.push(
            measure(
                label.clone(),
                &dir,
                &database,
                &pki,
                &pki_dir,
                &store,
                started,
            )
            .await?,
        );
        let _ = std::fs::remove_dir_all(database.parent().unwrap_or(&dir));
    }
    s3.stop();
    let _ = std::fs::remove_dir_all(&dir);

    println!(
        "{:<14} {:>9} {:>9} {:>10} {:>9} {:>11} {:>10} {:>11} {:>13} {:>13}",
        "database",
        "on disk",
        "stored",
        "1st byte",
        "snapshot",
        "MiB/s",
        "restore",
        "agent peak",
        "restore agent",
        "operator peak"
    );
    for f in &figures {
        let mib = |b: u64| b as f64 / 1048576.0;
        println!(
            "{:<14} {:>7.0}Mi {:>7.0}Mi {:>9.1}s {:>8.1}s {:>11.0} {:>9.1}s {:>9.0}Mi {:>11.0}Mi {:>6.0}/{:.0}Mi",
            f.label,
            mib(f.on_disk),
            mib(f.size),
            f.first_byte.as_secs_f64(),
            f.stored_in.as_secs_f64(),
            mib(f.size) / f.stored_in.as_secs_f64(),
            f.restored_in.as_secs_f64(),
            f.agent_peak,
            f.restore_agent_peak,
            f.operator_peak.max(f.restore_operator_peak),
            f.operator_before,
        );
        println!(
            "  {}: {} rows committed during the copy",
            f.label, f.written_during
        );
    }
    println!(
        "operator peak: resident memory of the operator's side while the bytes passed / before; agent peaks are the processes' own"
    );
    Ok(())
}
