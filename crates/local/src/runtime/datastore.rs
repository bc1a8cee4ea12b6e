//! A tenant's datastore as k3s keeps it: kine over sqlite, in the tenant's data folder. That
//! folder is the `server` folder of the claim's volume when the claim is bound to a host-path
//! volume on this machine (the test world's), as in k3s's pod; otherwise a folder that stands in
//! for the volume, following the claim (its name and UID), not the pod, and going when the claim
//! goes.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tenantplane_controller::build::layout::RUN_AS_USER;
use tenantplane_controller::names::DATA_VOLUME;

use tenantplane_testenv::process::tail;
use tenantplane_testenv::process::{self, Handle};
use tenantplane_testenv::{Error, Result};

/// The file in a data folder that names the claim it belongs to (by UID); only folders holding
/// one are ever pruned.
const CLAIM_FILE: &str = "claim-uid";
/// The longest path a unix socket may have (`sun_path` holds 108 bytes with the final NUL).
const MAX_SOCKET_PATH: usize = 107;
/// How long kine may take to open its database and listen.
const KINE_START_TIMEOUT: Duration = Duration::from_secs(30);

/// The data folder of one control-plane pod, and the claim it belongs to.
pub(super) struct Volume {
    pub dir: PathBuf,
    pub claim_uid: String,
}

/// The data folder of control-plane pod `pod`: `<dir>/<namespace>/<claim>-<claim UID>` for the
/// claim behind its `data` volume (the StatefulSet's volumeClaimTemplate). A pod made again for
/// the same claim finds its data; a new claim of the same name (a TenantCluster made again with
/// the old name) starts empty. An error while the claim is missing (the runtime tries again).
pub(super) async fn volume(client: &Client, dir: &Path, pod: &Pod) -> Result<Volume> {
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let claim = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .find(|v| v.name == DATA_VOLUME)
        .and_then(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.clone())
        .ok_or_else(|| {
            Error::Io(format!(
                "pod {ns}/{name} has no {DATA_VOLUME} volume from a claim, which holds the tenant's data"
            ))
        })?;
    // The scheduler places a pod only once its claims are bound, so the claim is there; a
    // kubelet would wait for it all the same.
    let found = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns)
        .get_opt(&claim)
        .await?
        .ok_or_else(|| Error::Io(format!("waiting for claim {ns}/{claim} of pod {name}")))?;
    let claim_uid = found.uid().unwrap_or_default();
    if let Some(root) = host_path_of(client, &found).await? {
        let dir = root.join("server");
        on_the_claim(&dir)?;
        return Ok(Volume { dir, claim_uid });
    }
    let dir = std::path::absolute(dir)?
        .join(&ns)
        .join(format!("{claim}-{claim_uid}"));
    std::fs::create_dir_all(dir.join("db"))?;
    std::fs::write(dir.join(CLAIM_FILE), &claim_uid)?;
    Ok(Volume { dir, claim_uid })
}

/// The folder of the host-path volume `claim` is bound to, when it is one (the test world's
/// provisioner makes such volumes, on this machine). An error while the claim is unbound or its
/// folder missing (the runtime tries again): falling back to a folder of our own then would split
/// the tenant's data in two.
async fn host_path_of(client: &Client, claim: &PersistentVolumeClaim) -> Result<Option<PathBuf>> {
    let name = claim.name_any();
    let waiting = |what: &str| Error::Io(format!("waiting for claim {name}: {what}"));
    let volume = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .ok_or_else(|| waiting("not bound yet"))?;
    let found = Api::<PersistentVolume>::all(client.clone())
        .get_opt(&volume)
        .await?
        .ok_or_else(|| waiting(&format!("its volume {volume} is not there yet")))?;
    let Some(path) = found
        .spec
        .and_then(|s| s.host_path)
        .map(|h| PathBuf::from(h.path))
    else {
        return Ok(None);
    };
    if !path.is_dir() {
        return Err(waiting(&format!(
            "its folder {} is missing",
            path.display()
        )));
    }
    Ok(Some(path))
}

/// Lay `server` (the claim's `server` folder, where k3s keeps its state) out as the control
/// plane's pod finds it, so the pod that replaces the stand-in opens the same database: a
/// `kubernetes` tenant's, after a distribution change, or a real k3s. The pod runs as
/// [`RUN_AS_USER`] and the stand-in as root, so the folders and an empty database are made
/// first and given to that user; sqlite run as root gives the journal and shared-memory files it
/// makes the database file's owner, so every file stays the pod's.
fn on_the_claim(server: &Path) -> Result<()> {
    let db = server.join("db");
    std::fs::create_dir_all(&db)?;
    let database = database(server);
    if !database.exists() {
        std::fs::File::create(&database)?;
    }
    let user = Some(RUN_AS_USER as u32);
    for path in [server, &db, &database] {
        std::os::unix::fs::chown(path, user, user)?;
    }
    Ok(())
}

/// Where kine listens: `kine.sock` in the data folder, as k3s has it. Unix socket paths are
/// limited to 107 bytes, and a deep data folder (a long namespace, the claim UID) can pass that;
/// then the socket is `tenantplane-kine-<claim UID>.sock` in the temporary folder: short, the
/// same at every restart, and one per claim.
pub(super) fn socket(volume: &Volume) -> PathBuf {
    let local = volume.dir.join("kine.sock");
    if local.as_os_str().len() <= MAX_SOCKET_PATH {
        local
    } else {
        std::env::temp_dir().join(format!("tenantplane-kine-{}.sock", volume.claim_uid))
    }
}

/// The sqlite database of a data folder.
pub(super) fn database(dir: &Path) -> PathBuf {
    dir.join("db").join("state.db")
}

/// kine's flags: sqlite in the data folder (WAL, as k3s configures it), the etcd API on the unix
/// socket, no metrics listener (it would bind every interface).
pub(super) fn kine_args(volume: &Volume, socket: &Path) -> Vec<String> {
    vec![
        format!(
            "--endpoint=sqlite://{}?_journal=WAL&_busy_timeout=30000&_synchronous=NORMAL&_txlock=immediate",
            database(&volume.dir).display()
        ),
        format!("--listen-address=unix://{}", socket.display()),
        "--metrics-bind-address=0".into(),
        "--log-format=json".into(),
    ]
}

/// Wait until kine listens on `socket` (it does once its database is open), for a bounded time;
/// otherwise an error that names kine's log and ends with its last lines.
pub(super) async fn wait_for_socket(kine: &Handle, socket: &Path, log: &Path) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let started = Instant::now();
    loop {
        if std::fs::metadata(socket).is_ok_and(|m| m.file_type().is_socket()) {
            return Ok(());
        }
        let exited = process::exited(kine);
        if exited.is_some() || started.elapsed() > KINE_START_TIMEOUT {
            let why = match exited {
                Some(status) => format!("exited ({status})"),
                None => format!("did not listen within {KINE_START_TIMEOUT:?}"),
            };
            return Err(Error::Component {
                name: "kine".into(),
                detail: format!(
                    "{why} on {}; its log is {}",
                    socket.display(),
                    log.display()
                ),
                log: tail(log, 20),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Remove the data folders under `dir` (of `namespace`, or of every namespace) whose claim no
/// longer exists, except those in `in_use`, as a volume goes with its claim. Folders are read
/// before claims are listed, so a folder made meanwhile (its claim existed before it) is never
/// taken for one whose claim is gone; nothing is removed when the list fails.
pub(super) async fn prune(
    client: &Client,
    dir: &Path,
    namespace: Option<&str>,
    in_use: &HashSet<PathBuf>,
) {
    let Ok(dir) = std::path::absolute(dir) else {
        return;
    };
    let namespaces: Vec<PathBuf> = match namespace {
        Some(ns) => vec![dir.join(ns)],
        None => subfolders(&dir),
    };
    let folders: Vec<(PathBuf, String)> = namespaces
        .iter()
        .flat_map(|ns| subfolders(ns))
        .filter(|f| !in_use.contains(f))
        .filter_map(|f| {
            let uid = std::fs::read_to_string(f.join(CLAIM_FILE)).ok()?;
            Some((f, uid.trim().to_string()))
        })
        .collect();
    if folders.is_empty() {
        return;
    }
    let api: Api<PersistentVolumeClaim> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let claims: HashSet<String> = match api.list_metadata(&ListParams::default()).await {
        Ok(list) => list.items.iter().filter_map(|c| c.uid()).collect(),
        Err(e) => {
            eprintln!(
                "local runtime: listing claims to prune data folders: {}",
                tenantplane_controller::api_message(&e)
            );
            return;
        }
    };
    for (folder, claim_uid) in folders {
        if claims.contains(&claim_uid) {
            continue;
        }
        let volume = Volume {
            dir: folder,
            claim_uid,
        };
        let socket = socket(&volume);
        if !socket.starts_with(&volume.dir) {
            let _ = std::fs::remove_file(&socket);
        }
        if let Err(e) = std::fs::remove_dir_all(&volume.dir) {
            eprintln!(
                "local runtime: removing {} (its claim is gone): {e}",
                volume.dir.display()
            );
        }
    }
}

fn subfolders(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(dir: &str) -> Volume {
        Volume {
            dir: PathBuf::from(dir),
            claim_uid: "0e703053-be03-40f0-be69-3bf6a28d769b".into(),
        }
    }

    #[test]
    fn the_socket_is_in_the_data_folder_unless_its_path_is_too_long() {
        let short = volume("/var/lib/tp/ns/data-dev-0-0e703053-be03-40f0-be69-3bf6a28d769b");
        assert_eq!(socket(&short), short.dir.join("kine.sock"));
        let deep = format!("/tmp/{}/data-dev-0-{}", "n".repeat(63), short.claim_uid);
        let long = volume(&deep);
        let path = socket(&long);
        assert!(!path.starts_with(&long.dir));
        assert!(
            path.as_os_str().len() <= MAX_SOCKET_PATH,
            "{}",
            path.display()
        );
        assert_eq!(
            path.file_name().unwrap().to_string_lossy(),
            format!("tenantplane-kine-{}.sock", long.claim_uid)
        );
        assert_eq!(socket(&long), path, "the same at every restart");
    }

    #[test]
    fn kine_keeps_sqlite_in_the_folder_and_listens_on_the_socket_only() {
        let v = volume("/data/ns/data-dev-0-0e703053-be03-40f0-be69-3bf6a28d769b");
        let args = kine_args(&v, &v.dir.join("kine.sock"));
        let endpoint = format!("--endpoint=sqlite://{}/db/state.db?", v.dir.display());
        assert!(args[0].starts_with(&endpoint), "{args:?}");
        assert!(args[0].contains("_journal=WAL"), "{args:?}");
        assert!(args.contains(&format!(
            "--listen-address=unix://{}/kine.sock",
            v.dir.display()
        )));
        assert!(args.contains(&"--metrics-bind-address=0".to_string()));
    }
}
