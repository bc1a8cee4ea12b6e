//! `tenantplane kubeconfig NAME`: the tenant's admin kubeconfig from Secret `<name>-kubeconfig`.
//! On the local dev cluster the tenant answers on a loopback port, so the server is rewritten to
//! the address the local runtime announces. `--context-name` renames its cluster, user and
//! context; `--merge` puts them into the user's kubeconfig file instead of printing.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::Api;
use kube::{Client, ResourceExt};
use tenantplane_api::{TenantCluster, conditions};
use tenantplane_controller::{kubeconfig, names};

use crate::host::{self, explain, program};

pub async fn run(client: &Client, namespace: &str, name: &str) -> anyhow::Result<String> {
    let mut text = stored(client, namespace, name).await?;
    // Only the local dev cluster announces a loopback address; a user who may not read pods
    // gets the kubeconfig as stored.
    let pod = Api::<Pod>::namespaced(client.clone(), namespace)
        .get_opt(&names::control_plane_pod(name))
        .await
        .ok()
        .flatten();
    if let Some(local) = pod
        .as_ref()
        .and_then(|p| p.annotations().get(names::ANNOTATION_LOCAL_ENDPOINT))
    {
        let endpoint = names::endpoint(name, namespace);
        let mut doc = kubeconfig::from_text(&text).context("reading the tenant's kubeconfig")?;
        for cluster in doc.clusters.iter_mut().filter_map(|c| c.cluster.as_mut()) {
            if cluster.server.as_deref() == Some(endpoint.as_str()) {
                cluster.server = Some(local.clone());
            }
        }
        text = kubeconfig::to_text(&doc)?;
    }
    Ok(text)
}

/// The tenant's kubeconfig as its Secret holds it (the server is the in-cluster Service
/// address), or why there is none.
pub async fn stored(client: &Client, namespace: &str, name: &str) -> anyhow::Result<String> {
    let secret_name = names::kubeconfig_secret(name);
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(&secret_name)
        .await
        .map_err(|e| explain(e, &format!("Secret {secret_name} in namespace {namespace}")))?;
    let Some(secret) = secret else {
        return Err(no_secret(client, namespace, name).await);
    };
    let text =
        tenantplane_controller::build::kubeconfig::stored_text(&secret).with_context(|| {
            format!(
                "Secret {secret_name} has no text under key {}",
                names::KUBECONFIG_KEY
            )
        })?;
    Ok(text.to_string())
}

/// Why there is no kubeconfig Secret: no such tenant, or it is not Ready yet.
async fn no_secret(client: &Client, namespace: &str, name: &str) -> anyhow::Error {
    let secret_name = names::kubeconfig_secret(name);
    let tc = Api::<TenantCluster>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await;
    match tc {
        Ok(None) => anyhow!(
            "Secret {secret_name} not found in namespace {namespace}: TenantCluster {name} not found in namespace {namespace}; list the tenants with `{} list -n {namespace}`",
            program()
        ),
        Ok(Some(tc)) => {
            let state = match tc.status {
                Some(status) => {
                    let phase = status.phase.map_or("<none>", |p| p.as_str());
                    let why = conditions::find(&status.conditions, conditions::READY)
                        .map(|c| format!(" ({}: {})", c.reason, c.message))
                        .unwrap_or_default();
                    format!("it is {phase}{why}")
                }
                None => "the operator has not reported on it yet (is it running?)".to_string(),
            };
            anyhow!(
                "Secret {secret_name} not found in namespace {namespace}: TenantCluster {name} is not Ready yet: {state}; see `{} status {name} -n {namespace}`",
                program()
            )
        }
        Err(_) => anyhow!(
            "Secret {secret_name} not found in namespace {namespace}: TenantCluster {name} is not Ready yet (or does not exist); check `{} status {name} -n {namespace}`",
            program()
        ),
    }
}

/// The tenant's kubeconfig with its cluster, user and context renamed.
pub fn rename(text: &str, context_name: &str) -> anyhow::Result<String> {
    let mut doc = kubeconfig::from_text(text).context("reading the tenant's kubeconfig")?;
    let (cluster, user, context) = kubeconfig::first_entries_named(&doc, context_name)?;
    doc.clusters = vec![cluster];
    doc.auth_infos = vec![user];
    doc.contexts = vec![context];
    doc.current_context = Some(context_name.into());
    Ok(kubeconfig::to_text(&doc)?)
}

/// What a merge did to each of cluster, user and context.
#[derive(Debug, PartialEq, Eq)]
pub struct Merged {
    pub text: String,
    /// (`cluster`/`user`/`context`, replaced an entry of that name)
    pub changes: Vec<(&'static str, bool)>,
}

/// `existing` (a kubeconfig file's text, possibly empty) with the tenant's cluster, user and
/// context put in under `context_name`: entries of the same names are replaced in place, every
/// other entry and field is kept, and the current context is left alone.
pub fn merge(existing: &str, tenant: &str, context_name: &str) -> anyhow::Result<Merged> {
    let tenant = kubeconfig::from_text(tenant).context("reading the tenant's kubeconfig")?;
    let (cluster, user, context) = kubeconfig::first_entries_named(&tenant, context_name)?;
    let mut doc = kubeconfig::from_text(existing)?;
    if kubeconfig::is_empty(&doc) {
        doc.api_version = Some("v1".into());
        doc.kind = Some("Config".into());
    }
    let changes = vec![
        ("cluster", put(&mut doc.clusters, cluster, |c| &c.name)),
        ("user", put(&mut doc.auth_infos, user, |u| &u.name)),
        ("context", put(&mut doc.contexts, context, |c| &c.name)),
    ];
    Ok(Merged {
        text: kubeconfig::to_text(&doc)?,
        changes,
    })
}

/// `entry` in place of the one of the same name in `list`, or appended; whether it replaced one.
fn put<T>(list: &mut Vec<T>, entry: T, name: impl Fn(&T) -> &String) -> bool {
    match list.iter().position(|e| name(e) == name(&entry)) {
        Some(i) => {
            list[i] = entry;
            true
        }
        None => {
            list.push(entry);
            false
        }
    }
}

/// Where `--merge` writes: the first file of `KUBECONFIG`, else `~/.kube/config`.
pub fn merge_target() -> anyhow::Result<PathBuf> {
    if let Some(first) = host::kubeconfig_env_paths().into_iter().next() {
        return Ok(first);
    }
    host::default_kubeconfig_path()
        .ok_or_else(|| anyhow!("cannot find your home folder for ~/.kube/config; set KUBECONFIG"))
}

/// Merge into the file at `path` (see [`update_file`]).
pub fn merge_into_file(path: &Path, tenant: &str, context_name: &str) -> anyhow::Result<Merged> {
    update_file(path, |existing| {
        let merged = merge(existing, tenant, context_name)
            .with_context(|| format!("merging into {}", path.display()))?;
        Ok((merged.text.clone(), merged))
    })
}

/// Rewrite the kubeconfig file at `path` with `change`, which gets its text (empty when there
/// is none) and returns the new text. As kubectl writes kubeconfig files: under `<path>.lock`,
/// through a temporary file renamed over it, readable by its owner only when new. A symlink is
/// followed, not replaced.
pub fn update_file<T>(
    path: &Path,
    change: impl FnOnce(&str) -> anyhow::Result<(String, T)>,
) -> anyhow::Result<T> {
    let path = match std::fs::canonicalize(path) {
        Ok(real) => real,
        Err(_) => path.to_path_buf(),
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let lock = path.with_file_name(format!(
        "{}.lock",
        path.file_name().unwrap_or_default().to_string_lossy()
    ));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&lock)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                anyhow!(
                    "{} is locked by {}: another kubectl or {} is writing it; if none is, remove the lock file",
                    path.display(),
                    lock.display(),
                    program()
                )
            } else {
                anyhow!("creating the lock file {}: {e}", lock.display())
            }
        })?;
    let result = (|| {
        let existing = match std::fs::read_to_string(&path) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(anyhow!("reading {}: {e}", path.display())),
        };
        let (text, value) = change(existing.as_deref().unwrap_or(""))?;
        let temp = path.with_file_name(format!(
            ".{}.tenantplane-{}",
            path.file_name().unwrap_or_default().to_string_lossy(),
            std::process::id()
        ));
        let mut file = new_private_file(&temp)?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .with_context(|| format!("writing {}", temp.display()))?;
        if let Ok(meta) = std::fs::metadata(&path) {
            let _ = std::fs::set_permissions(&temp, meta.permissions());
        }
        std::fs::rename(&temp, &path).with_context(|| {
            let _ = std::fs::remove_file(&temp);
            format!("replacing {}", path.display())
        })?;
        Ok(value)
    })();
    let _ = std::fs::remove_file(&lock);
    result
}

/// Write `text` to a new or replaced file at `path`, readable by its owner only.
pub fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut file = new_private_file(path)?;
    #[cfg(unix)]
    {
        // An existing file keeps its mode on open; this one holds a client key.
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("making {} private", path.display()))?;
    }
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(unix)]
fn new_private_file(path: &Path) -> anyhow::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))
}

#[cfg(not(unix))]
fn new_private_file(path: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))
}

/// `added cluster dev, user dev and context dev` / `replaced …`.
pub fn describe_changes(merged: &Merged, context_name: &str) -> String {
    let say = |replaced: bool| {
        let kinds: Vec<String> = merged
            .changes
            .iter()
            .filter(|(_, r)| *r == replaced)
            .map(|(kind, _)| format!("{kind} {context_name}"))
            .collect();
        match kinds.as_slice() {
            [] => None,
            [one] => Some(one.clone()),
            [init @ .., last] => Some(format!("{} and {last}", init.join(", "))),
        }
    };
    let mut parts = vec![];
    if let Some(added) = say(false) {
        parts.push(format!("added {added}"));
    }
    if let Some(replaced) = say(true) {
        parts.push(format!("replaced {replaced}"));
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_yaml::Value;

    const TENANT: &str = "apiVersion: v1
kind: Config
clusters:
- name: dev
  cluster:
    server: https://127.0.0.1:40001
    certificate-authority-data: Q0E=
users:
- name: dev
  user:
    client-certificate-data: Q0VSVA==
    client-key-data: S0VZ
contexts:
- name: dev
  context:
    cluster: dev
    user: dev
current-context: dev
";

    const MINE: &str = "apiVersion: v1
kind: Config
preferences:
  colors: true
clusters:
- name: prod
  cluster:
    server: https://prod.example:6443
- name: team-dev-dev
  cluster:
    server: https://stale.example:6443
users:
- name: me
  user:
    token: abc
contexts:
- name: prod
  context:
    cluster: prod
    user: me
    namespace: shop
current-context: prod
";

    fn doc(text: &str) -> Value {
        serde_yaml::from_str(text).unwrap()
    }

    #[test]
    fn merge_replaces_same_names_and_keeps_everything_else() {
        let merged = merge(MINE, TENANT, "team-dev-dev").unwrap();
        assert_eq!(
            merged.changes,
            [("cluster", true), ("user", false), ("context", false)]
        );
        assert_eq!(
            describe_changes(&merged, "team-dev-dev"),
            "added user team-dev-dev and context team-dev-dev; replaced cluster team-dev-dev"
        );
        let out = doc(&merged.text);
        let before = doc(MINE);
        assert_eq!(out["current-context"], "prod", "the current context stays");
        assert_eq!(out["preferences"], before["preferences"]);
        assert_eq!(out["clusters"][0], before["clusters"][0], "prod is kept");
        assert_eq!(out["clusters"][1]["name"], "team-dev-dev");
        assert_eq!(
            out["clusters"][1]["cluster"]["server"],
            "https://127.0.0.1:40001"
        );
        assert_eq!(out["clusters"].as_sequence().unwrap().len(), 2);
        assert_eq!(out["users"][0], before["users"][0]);
        assert_eq!(out["users"][1]["user"]["client-key-data"], "S0VZ");
        assert_eq!(out["contexts"][0], before["contexts"][0]);
        assert_eq!(
            out["contexts"][1]["context"],
            doc("cluster: team-dev-dev\nuser: team-dev-dev")
        );

        // Merging again replaces all three and adds nothing.
        let again = merge(&merged.text, TENANT, "team-dev-dev").unwrap();
        assert!(again.changes.iter().all(|(_, replaced)| *replaced));
        assert_eq!(doc(&again.text), out);
    }

    #[test]
    fn merge_into_nothing_makes_a_kubeconfig() {
        let merged = merge("", TENANT, "dev").unwrap();
        let out = doc(&merged.text);
        assert_eq!(out["kind"], "Config");
        assert_eq!(out["contexts"][0]["name"], "dev");
        assert!(out.get("current-context").is_none());
        assert_eq!(
            describe_changes(&merged, "dev"),
            "added cluster dev, user dev and context dev"
        );
        assert!(merge("- a\n- b\n", TENANT, "dev").is_err());
    }

    #[test]
    fn rename_renames_all_three_and_the_current_context() {
        let out = doc(&rename(TENANT, "acme").unwrap());
        assert_eq!(out["current-context"], "acme");
        assert_eq!(out["clusters"][0]["name"], "acme");
        assert_eq!(out["users"][0]["name"], "acme");
        assert_eq!(out["contexts"][0]["context"]["user"], "acme");
        assert_eq!(
            out["clusters"][0]["cluster"]["server"],
            "https://127.0.0.1:40001"
        );
    }

    #[test]
    fn merge_into_file_follows_symlinks_and_keeps_the_mode() {
        let dir = std::env::temp_dir().join(format!("tenantplane-merge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let real = dir.join("real-config");
        std::fs::write(&real, MINE).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).unwrap();
            let link = dir.join("config");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&real, &link).unwrap();
            merge_into_file(&link, TENANT, "dev").unwrap();
            assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
            let mode = std::fs::metadata(&real).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let out = doc(&std::fs::read_to_string(&real).unwrap());
        assert_eq!(out["contexts"][1]["name"], "dev");
        assert!(!dir.join("real-config.lock").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
