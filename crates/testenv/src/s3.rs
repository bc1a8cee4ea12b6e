//! A real S3-compatible object store for snapshot tests and the dev cluster: SeaweedFS's `weed
//! server` (master, volume server, filer and S3 gateway in one process), every port on loopback,
//! its data in a folder of its own, with one identity whose keys this module makes up. Requests
//! without those keys are refused. Its telemetry (on by default upstream) is off: nothing dials
//! out.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::binaries::Binaries;
use crate::process::{self, Handle};
use crate::{Error, Result};

/// The binary's name in the test binaries' folder.
pub const WEED: &str = "weed";

/// A running store.
#[derive(Debug)]
pub struct S3Server {
    handle: Handle,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// The access key id that signs requests.
    pub access_key: String,
    /// The secret access key that signs requests.
    pub secret_key: String,
    master: String,
    weed: PathBuf,
}

/// A loopback port `p` below 20000 with `p + 10000` free too: SeaweedFS serves gRPC on each of
/// its ports plus 10000, and the local ephemeral range starts above 32767.
fn free_port_pair(taken: &[u16]) -> Result<u16> {
    let seed = std::process::id() as u64
        ^ u64::from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0),
        );
    for n in 0..2000u64 {
        let port = 10000 + ((seed + n * 7919) % 9000) as u16;
        let clashes = taken
            .iter()
            .any(|t| [*t, t + 10000].contains(&port) || [*t, t + 10000].contains(&(port + 10000)));
        if clashes {
            continue;
        }
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10000) {
            return Ok(port);
        }
    }
    Err(Error::Io(
        "no free loopback port pair below 20000 for SeaweedFS".into(),
    ))
}

/// A made-up key of `len` characters from `/dev/urandom`.
fn random_key(len: usize) -> Result<String> {
    use std::io::Read;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijklmnopqrstuvwxyz";
    let mut bytes = vec![0u8; len];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect())
}

impl S3Server {
    /// Start a store with its data in `dir` (made empty first), and wait until it answers.
    pub async fn start(binaries: &Binaries, dir: &Path) -> Result<Self> {
        let weed = binaries.path(WEED);
        if !weed.is_file() {
            return Err(Error::NotBuilt(format!(
                "{WEED} missing from {}: run testenv/build.sh",
                binaries.dir().display()
            )));
        }
        // A leftover data folder holds an old cluster id, with which volumes are refused.
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir.join("data"))?;
        let access_key = format!("TP{}", random_key(18)?.to_uppercase());
        let secret_key = random_key(40)?;
        let config = dir.join("s3.json");
        std::fs::write(
            &config,
            serde_json::json!({"identities": [{
                "name": "tenantplane",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }]})
            .to_string(),
        )?;
        let mut ports = Vec::new();
        for _ in 0..4 {
            let p = free_port_pair(&ports)?;
            ports.push(p);
        }
        let [master, volume, filer, s3] = [ports[0], ports[1], ports[2], ports[3]];
        let args: Vec<String> = [
            "server".to_string(),
            "-ip=127.0.0.1".into(),
            "-ip.bind=127.0.0.1".into(),
            format!("-dir={}", dir.join("data").display()),
            format!("-master.port={master}"),
            format!("-volume.port={volume}"),
            "-filer".into(),
            format!("-filer.port={filer}"),
            "-s3".into(),
            format!("-s3.port={s3}"),
            "-s3.port.iceberg=0".into(),
            "-s3.port.lance=0".into(),
            format!("-s3.config={}", config.display()),
            // Upstream posts usage to its telemetry service by default: never from here.
            "-master.telemetry=false".into(),
            // Small volumes, many allowed: each bucket takes volumes of its own.
            "-master.volumeSizeLimitMB=64".into(),
            "-volume.max=200".into(),
            "-volume.preStopSeconds=0".into(),
            "-metricsPort=0".into(),
        ]
        .into();
        let log = dir.join("weed.log");
        let handle = process::spawn(
            "seaweedfs",
            &weed,
            &args,
            // One copy of each volume (a one-server cluster).
            &[("WEED_MASTER_VOLUME_GROWTH_COPY_1", "1")],
            &log,
        )?;
        let server = Self {
            handle,
            endpoint: format!("http://127.0.0.1:{s3}"),
            access_key,
            secret_key,
            master: format!("127.0.0.1:{master}"),
            weed,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            // The S3 port answers once the filer behind it is up.
            if tokio::net::TcpStream::connect(("127.0.0.1", s3))
                .await
                .is_ok()
            {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                process::stop(&server.handle);
                return Err(Error::Io(format!(
                    "SeaweedFS did not answer on port {s3} within 60s; its log:\n{}",
                    process::tail(&log, 30)
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(server)
    }

    /// Run commands in SeaweedFS's shell; what it printed.
    async fn shell(&self, commands: &str) -> Result<String> {
        use tokio::io::AsyncWriteExt;
        let mut child = tokio::process::Command::new(&self.weed)
            .arg("shell")
            .arg(format!("-master={}", self.master))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(format!("{commands}\nexit\n").as_bytes())
                .await?;
        }
        let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
            .await
            .map_err(|_| Error::Io("weed shell did not finish within 30s".into()))??;
        Ok(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }

    /// Make a bucket (SeaweedFS's shell, as its operators do). The shell exits 0 whatever
    /// happened, so the bucket list says whether it is there; a store still starting is retried.
    pub async fn create_bucket(&self, name: &str) -> Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let said = self
                .shell(&format!("s3.bucket.create -name {name}"))
                .await?;
            let listed = self.shell("s3.bucket.list").await?;
            if listed
                .lines()
                .any(|l| l.split_whitespace().next() == Some(name))
            {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Error::Io(format!(
                    "creating bucket {name} with weed shell failed: {}",
                    said.trim()
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Stop the store (its data stays in its folder until the folder goes).
    pub fn stop(&self) {
        process::stop(&self.handle);
    }
}
