//! The datastore's bytes, copied consistently while kine keeps writing, and put back.
//!
//! A copy is sqlite's online backup of the whole database in one step: one read transaction, so
//! under kine's write-ahead log the copy is the database as of one commit, never a half-written
//! one. It goes to a scratch file that is checked (`PRAGMA quick_check`) and hashed before a byte
//! leaves the pod. A restore writes the received bytes beside the database, checks the hash and
//! the file, and only then renames it over the database: the old database stays whole until the
//! new one is known good.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::backup::{Backup, StepResult};
use rusqlite::{Connection, OpenFlags};

/// How long a copy waits on a writer's lock before it gives up (WAL readers rarely wait).
const BUSY_FOR: Duration = Duration::from_secs(30);

/// What goes wrong copying, checking or putting back a database. Each says which file and what
/// was being done; the messages are what the snapshot's or the restore's status shows.
#[derive(Debug, thiserror::Error)]
pub enum DatabaseError {
    /// A file could not be read, made, written, renamed or removed.
    #[error("{action} {}: {source}", path.display())]
    File {
        /// What was being done: "reading", "creating", "renaming", …
        action: &'static str,
        /// The file it was done to.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// sqlite failed at a step of the copy or of the check.
    #[error("{action} {}: {source}", path.display())]
    Sqlite {
        /// The step that failed, such as "opening" or "copying".
        action: &'static str,
        /// The database it failed on.
        path: PathBuf,
        /// What sqlite said.
        #[source]
        source: rusqlite::Error,
    },
    /// No database file where the copy looked for one.
    #[error("there is no database at {}", .0.display())]
    Missing(PathBuf),
    /// A received or copied file that sqlite cannot open as a database.
    #[error("{} is not a readable sqlite database: {source}", path.display())]
    Unreadable {
        /// The file sqlite could not open.
        path: PathBuf,
        /// What sqlite said.
        #[source]
        source: rusqlite::Error,
    },
    /// A writer held the database locked for longer than the copy waits.
    #[error("copying {}: the database stayed locked for {seconds}s", path.display())]
    Locked {
        /// The database.
        path: PathBuf,
        /// How long the copy waited.
        seconds: u64,
    },
    /// The file fails sqlite's `quick_check`: it is damaged.
    #[error("{} fails sqlite's quick_check: {verdict}", path.display())]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// What `quick_check` found.
        verdict: String,
    },
    /// The received bytes do not hash to the checksum the snapshot recorded.
    #[error(
        "the received snapshot's checksum is sha256:{got}, not the expected sha256:{expected}: it is corrupt or was cut short ({size} bytes received)"
    )]
    Checksum {
        /// The received bytes' SHA-256, hex.
        got: String,
        /// The SHA-256 the snapshot recorded, hex.
        expected: String,
        /// How many bytes arrived.
        size: u64,
    },
    /// A checksum that is not `sha256:` and 64 hex digits.
    #[error("checksum {text:?} {why}")]
    ChecksumText {
        /// The checksum as written.
        text: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Removing the distribution's own state from a received database failed.
    #[error("removing {pattern} from the snapshot: {source}")]
    Forget {
        /// The `LIKE` pattern of the keys being removed.
        pattern: &'static str,
        /// What sqlite said.
        #[source]
        source: rusqlite::Error,
    },
}

impl DatabaseError {
    /// A stable name for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            DatabaseError::File { .. } => "DatabaseFile",
            DatabaseError::Sqlite { .. } | DatabaseError::Forget { .. } => "DatabaseSqlite",
            DatabaseError::Missing(_) => "DatabaseMissing",
            DatabaseError::Locked { .. } => "DatabaseLocked",
            DatabaseError::Corrupt { .. } | DatabaseError::Unreadable { .. } => "DatabaseCorrupt",
            DatabaseError::Checksum { .. } | DatabaseError::ChecksumText { .. } => {
                "ChecksumMismatch"
            }
        }
    }
}

fn file(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DatabaseError {
    let path = path.to_path_buf();
    move |source| DatabaseError::File {
        action,
        path,
        source,
    }
}

fn sqlite(action: &'static str, path: &Path) -> impl FnOnce(rusqlite::Error) -> DatabaseError {
    let path = path.to_path_buf();
    move |source| DatabaseError::Sqlite {
        action,
        path,
        source,
    }
}

/// A finished copy: a scratch file, its size and SHA-256.
#[derive(Debug)]
pub struct Copy {
    /// The scratch file that holds the copy.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256, hex.
    pub sha256: String,
}

/// `sha256:<hex>`, as statuses and manifests write a checksum.
pub fn checksum_text(sha256_hex: &str) -> String {
    format!("sha256:{sha256_hex}")
}

/// The hex digest inside a `sha256:<hex>` checksum, or why it is not one.
pub fn parse_checksum(text: &str) -> Result<&str, DatabaseError> {
    let wrong = |why| DatabaseError::ChecksumText {
        text: text.to_string(),
        why,
    };
    let hex = text
        .strip_prefix("sha256:")
        .ok_or_else(|| wrong("does not start with sha256:"))?;
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(wrong("is not 64 hex digits"));
    }
    Ok(hex)
}

/// A running SHA-256, fed as bytes pass.
pub struct Hasher(ring::digest::Context);

impl Default for Hasher {
    fn default() -> Self {
        Self(ring::digest::Context::new(&ring::digest::SHA256))
    }
}

impl Hasher {
    /// Feed `bytes` to the hash.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The digest as lowercase hex.
    pub fn finish(self) -> String {
        self.0
            .finish()
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// Bytes counted and hashed as they pass through a stream: tap the stream, drain it, then take
/// the size and SHA-256 (hex).
#[derive(Clone, Default)]
pub struct Tally(std::sync::Arc<std::sync::Mutex<(Hasher, u64)>>);

impl Tally {
    /// `stream`, unchanged, with every chunk that passes counted and hashed.
    pub fn tap<S, E>(
        &self,
        stream: S,
    ) -> impl futures::Stream<Item = Result<bytes::Bytes, E>> + use<S, E>
    where
        S: futures::Stream<Item = Result<bytes::Bytes, E>>,
    {
        use futures::StreamExt;
        let tally = self.0.clone();
        stream.inspect(move |chunk| {
            if let Ok(bytes) = chunk {
                let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
                t.0.update(bytes);
                t.1 += bytes.len() as u64;
            }
        })
    }

    /// The size and SHA-256 (hex) of what passed (the tally starts again).
    pub fn take(&self) -> (u64, String) {
        let (hasher, size) = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        (size, hasher.finish())
    }
}

/// The SHA-256 and size of a file, read in blocks.
pub fn hash_file(path: &Path) -> Result<(u64, String), DatabaseError> {
    let mut file = std::fs::File::open(path).map_err(file("reading", path))?;
    let mut hasher = Hasher::default();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(self::file("reading", path))?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok((size, hasher.finish()))
}

/// Copy `database` into a new file in `scratch` (blocking: run it off the async threads).
pub fn backup(database: &Path, scratch: &Path) -> Result<Copy, DatabaseError> {
    if !database.exists() {
        return Err(DatabaseError::Missing(database.to_path_buf()));
    }
    std::fs::create_dir_all(scratch).map_err(file("making the scratch folder", scratch))?;
    // A name of its own per copy: a copy whose request went away may still be writing.
    static COPIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COPIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = scratch.join(format!("snapshot-{}-{n}.db", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let result = (|| {
        // Read-write without create: a WAL reader may need to set up the shared-memory index,
        // and a missing database must not be created empty.
        let source = Connection::open_with_flags(
            database,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(sqlite("opening", database))?;
        source
            .busy_timeout(BUSY_FOR)
            .map_err(sqlite("opening", database))?;
        let mut target = Connection::open(&path).map_err(sqlite("creating the copy", &path))?;
        {
            let backup = Backup::new(&source, &mut target)
                .map_err(sqlite("starting the copy of", database))?;
            let deadline = std::time::Instant::now() + BUSY_FOR;
            // All pages in one step: one read transaction, so the copy is one commit's state.
            loop {
                match backup.step(-1).map_err(sqlite("copying", database))? {
                    StepResult::Done => break,
                    _ if std::time::Instant::now() > deadline => {
                        return Err(DatabaseError::Locked {
                            path: database.to_path_buf(),
                            seconds: BUSY_FOR.as_secs(),
                        });
                    }
                    _ => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
        check(&target, &path)?;
        drop(target);
        let (size, sha256) = hash_file(&path)?;
        Ok(Copy {
            path: path.clone(),
            size,
            sha256,
        })
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&path);
    }
    result
}

/// `PRAGMA quick_check` of an open database: "ok", or what sqlite found wrong.
fn check(db: &Connection, path: &Path) -> Result<(), DatabaseError> {
    let verdict: String = db
        .query_row("PRAGMA quick_check", [], |row| row.get(0))
        .map_err(|source| DatabaseError::Unreadable {
            path: path.to_path_buf(),
            source,
        })?;
    if verdict != "ok" {
        return Err(DatabaseError::Corrupt {
            path: path.to_path_buf(),
            verdict,
        });
    }
    Ok(())
}

/// Where a restore writes what it receives before it is checked: beside the database, so the
/// final rename stays on one file system.
pub fn incoming_path(database: &Path) -> PathBuf {
    let mut name = database
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".incoming");
    database.with_file_name(name)
}

/// Keys of the datastore that belong to the control plane that wrote them, not to the tenant:
/// k3s's bootstrap data (its certificates, encrypted with its token: a k3s server that finds
/// them under another token refuses to start, and one that finds them older than its files on
/// disk exits), its dynamic serving certificate, and its node passwords. Gone, k3s writes them
/// afresh from the files the pod mounts. Nothing else of the tenant is touched.
const CONTROL_PLANE_KEYS: &[&str] = &[
    "/bootstrap/%",
    "/registry/secrets/kube-system/k3s-serving",
    "/registry/secrets/kube-system/%.node-password.k3s",
];

/// Remove [`CONTROL_PLANE_KEYS`] from a received database (kine's `kine` table; a database
/// without one is left alone), before it is put in place.
fn forget_distribution_state(path: &Path) -> Result<(), DatabaseError> {
    let db = Connection::open(path).map_err(sqlite("opening", path))?;
    let has_kine: bool = db
        .query_row(
            "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'kine'",
            [],
            |r| r.get(0),
        )
        .map_err(sqlite("reading", path))?;
    if has_kine {
        for pattern in CONTROL_PLANE_KEYS {
            db.execute("DELETE FROM kine WHERE name LIKE ?1", [pattern])
                .map_err(|source| DatabaseError::Forget { pattern, source })?;
        }
    }
    db.close().map_err(|(_, e)| sqlite("closing", path)(e))
}

/// A file being received, hashed as it is written.
pub struct Incoming {
    path: PathBuf,
    file: std::fs::File,
    hasher: Hasher,
    size: u64,
}

impl Incoming {
    /// Start receiving a database that is to replace `database`: a new file beside it.
    pub fn create(database: &Path) -> Result<Self, DatabaseError> {
        if let Some(dir) = database.parent() {
            std::fs::create_dir_all(dir).map_err(file("making", dir))?;
        }
        let path = incoming_path(database);
        let file = std::fs::File::create(&path).map_err(file("creating", &path))?;
        Ok(Self {
            path,
            file,
            hasher: Hasher::default(),
            size: 0,
        })
    }

    /// Append `bytes` to the file and the hash.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), DatabaseError> {
        self.hasher.update(bytes);
        self.size += bytes.len() as u64;
        self.file
            .write_all(bytes)
            .map_err(file("writing", &self.path))
    }

    /// Check the bytes against `sha256_hex` and the file as a database, then put it in place of
    /// `database` (its write-ahead log and index go: they belong to the old file). Nothing of the
    /// old database is touched before the checks pass; on any failure the received file goes.
    pub fn install(mut self, database: &Path, sha256_hex: &str) -> Result<u64, DatabaseError> {
        let result = (|| {
            self.file
                .flush()
                .and_then(|()| self.file.sync_all())
                .map_err(file("writing", &self.path))?;
            let got = std::mem::take(&mut self.hasher).finish();
            if !got.eq_ignore_ascii_case(sha256_hex) {
                return Err(DatabaseError::Checksum {
                    got,
                    expected: sha256_hex.to_string(),
                    size: self.size,
                });
            }
            let db = Connection::open_with_flags(&self.path, OpenFlags::SQLITE_OPEN_READ_ONLY)
                .map_err(|source| DatabaseError::Unreadable {
                    path: self.path.clone(),
                    source,
                })?;
            check(&db, &self.path)?;
            drop(db);
            forget_distribution_state(&self.path)?;
            for suffix in ["-wal", "-shm"] {
                let mut name = database.as_os_str().to_os_string();
                name.push(suffix);
                let old = PathBuf::from(name);
                match std::fs::remove_file(&old) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(file("removing the old database's", &old)(e));
                    }
                    _ => {}
                }
            }
            std::fs::rename(&self.path, database)
                .map_err(file("putting the snapshot in place at", database))?;
            if let Some(dir) = database.parent()
                && let Ok(d) = std::fs::File::open(dir)
            {
                let _ = d.sync_all();
            }
            Ok(self.size)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&self.path);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database(dir: &Path) -> PathBuf {
        let path = dir.join("state.db");
        let db = Connection::open(&path).unwrap();
        db.execute_batch(
            "PRAGMA journal_mode=WAL; CREATE TABLE kine (id INTEGER PRIMARY KEY, name TEXT, value BLOB);",
        )
        .unwrap();
        path
    }

    fn rows(path: &Path) -> i64 {
        Connection::open(path)
            .unwrap()
            .query_row("SELECT count(*) FROM kine", [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn a_copy_taken_during_writes_holds_a_prefix_of_them_and_restores() {
        let dir = tempdir();
        let path = database(&dir);
        // A writer commits one row at a time while copies are taken.
        let writer_path = path.clone();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let db = Connection::open(&writer_path).unwrap();
                let mut n = 0i64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    db.execute(
                        "INSERT INTO kine (id, name, value) VALUES (?1, ?2, zeroblob(512))",
                        rusqlite::params![n, format!("/registry/x/{n}")],
                    )
                    .unwrap();
                    n += 1;
                }
                n
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        let mut copies = Vec::new();
        for _ in 0..3 {
            let copy = backup(&path, &dir.join("scratch")).unwrap();
            let kept = dir.join(format!("copy-{}.db", copies.len()));
            std::fs::rename(&copy.path, &kept).unwrap();
            assert_eq!(hash_file(&kept).unwrap(), (copy.size, copy.sha256));
            copies.push(kept);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let written = writer.join().unwrap();
        for copy in &copies {
            // A prefix: rows 0..n, no gap.
            let db = Connection::open(copy).unwrap();
            let (count, max): (i64, i64) = db
                .query_row(
                    "SELECT count(*), coalesce(max(id), -1) FROM kine",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .unwrap();
            assert_eq!(count, max + 1, "a gap in {}", copy.display());
            assert!(count <= written);
        }
        // Restore the second copy over the live database.
        let (_, sha) = hash_file(&copies[1]).unwrap();
        let expected = rows(&copies[1]);
        let mut incoming = Incoming::create(&path).unwrap();
        incoming.write(&std::fs::read(&copies[1]).unwrap()).unwrap();
        incoming.install(&path, &sha).unwrap();
        assert_eq!(rows(&path), expected);
    }

    #[test]
    fn a_corrupt_or_short_restore_leaves_the_database_as_it_was() {
        let dir = tempdir();
        let path = database(&dir);
        Connection::open(&path)
            .unwrap()
            .execute("INSERT INTO kine (id, name) VALUES (1, 'a')", [])
            .unwrap();
        let copy = backup(&path, &dir.join("scratch")).unwrap();
        let bytes = std::fs::read(&copy.path).unwrap();
        // Cut short.
        let mut incoming = Incoming::create(&path).unwrap();
        incoming.write(&bytes[..bytes.len() / 2]).unwrap();
        let e = incoming.install(&path, &copy.sha256).unwrap_err();
        assert!(matches!(e, DatabaseError::Checksum { .. }), "{e}");
        assert!(e.to_string().contains("corrupt or was cut short"), "{e}");
        assert_eq!(rows(&path), 1);
        assert!(!incoming_path(&path).exists());
        // Right checksum, wrong bytes: not a database.
        let garbage = vec![7u8; 4096];
        let mut h = Hasher::default();
        h.update(&garbage);
        let mut incoming = Incoming::create(&path).unwrap();
        incoming.write(&garbage).unwrap();
        let e = incoming.install(&path, &h.finish()).unwrap_err();
        assert!(matches!(e, DatabaseError::Unreadable { .. }), "{e}");
        assert_eq!(e.label(), "DatabaseCorrupt");
        assert_eq!(rows(&path), 1);
    }

    #[test]
    fn a_missing_database_is_not_created() {
        let dir = tempdir();
        let e = backup(&dir.join("none.db"), &dir.join("scratch")).unwrap_err();
        assert!(matches!(e, DatabaseError::Missing(_)), "{e}");
        assert!(e.to_string().contains("there is no database"), "{e}");
        assert!(!dir.join("none.db").exists());
    }

    #[test]
    fn checksums_read_back() {
        assert_eq!(
            parse_checksum(&checksum_text(&"a".repeat(64))).unwrap(),
            "a".repeat(64)
        );
        assert!(parse_checksum("md5:abc").is_err());
        assert!(parse_checksum("sha256:xyz").is_err());
    }

    fn tempdir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "tenantplane-copy-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
