//! Running the dev cluster in namespaces of its own, reachable from the caller's.
//!
//! A real node needs a network namespace with no way out ([`crate::host_cluster::real_node`]).
//! When `tenantplane dev` is started in one that has other interfaces, it runs itself again in new
//! network, mount and PID namespaces ([`spawn_isolated`]): when that child ends, or is killed with
//! the process that started it, every process in it ends and the namespaces (interfaces, nftables
//! tables, mounts, the pods' named network namespaces) go with them. [`mirror_loopback`] then makes each loopback port the child
//! listens on answer on the same port here, so the kubeconfigs it writes (`127.0.0.1:<port>`)
//! work from both sides.
//!
//! Ours because no crate forwards between network namespaces: a socket belongs to the namespace
//! of the thread that made it, so one thread enters the child's namespace and makes them all.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// `program args…` in new network, mount and PID namespaces (loopback up, a /run/netns of its
/// own), killed with this process.
pub fn spawn_isolated(program: &Path, args: &[String]) -> std::io::Result<tokio::process::Child> {
    let mut cmd = tokio::process::Command::new("unshare");
    cmd.args([
        "--net",
        "--mount",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        "--",
        "sh",
        "-c",
        // The pods' network namespaces are named in a /run/netns of the mount namespace's own
        // (root only, as a real node), so none is left on the machine however the child ends.
        "ip link set lo up && { [ \"$(id -u)\" != 0 ] || { mkdir -p /run/netns && mount -t tmpfs -o mode=0755 netns /run/netns; }; } && exec \"$@\"",
        "tenantplane-dev",
    ])
    .arg(program)
    .args(args)
    .stdin(Stdio::inherit());
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Pass an interrupt (Ctrl-C) on to `pid`. From a terminal it has heard it already (it is in the
/// same process group); from `kill -INT` of this process alone, it has not.
pub fn interrupt(pid: u32) {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGINT);
    }
}

/// The pid of the process `unshare` started in the new namespaces (its only child), once it is
/// there.
pub async fn inner_pid(unshare_pid: u32) -> Option<u32> {
    for _ in 0..100 {
        let path = format!("/proc/{unshare_pid}/task/{unshare_pid}/children");
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse().ok()))
        {
            return Some(pid);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Ports listening on loopback (or every address) in the network namespace of `pid`, IPv4 or
/// IPv6 (Go's listeners on `0.0.0.0` are dual-stack sockets, listed as IPv6).
fn listening_ports(pid: u32) -> Vec<u16> {
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) {
            ports.extend(parse_listening(&text));
        }
    }
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// Addresses (as `/proc/net/tcp*` write them) a connection to 127.0.0.1 reaches: IPv4 loopback
/// and wildcard, IPv6 wildcard and the IPv4-mapped loopback.
const REACHED_FROM_LOOPBACK: &[&str] = &[
    "0100007F",
    "00000000",
    "00000000000000000000000000000000",
    "0000000000000000FFFF00000100007F",
];

/// The `LISTEN` (state `0A`) entries of a `/proc/net/tcp` or `tcp6` table that a connection to
/// 127.0.0.1 reaches.
fn parse_listening(table: &str) -> Vec<u16> {
    let mut ports: Vec<u16> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (address, state) = (fields.get(1)?, fields.get(3)?);
            if *state != "0A" {
                return None;
            }
            let (ip, port) = address.split_once(':')?;
            REACHED_FROM_LOOPBACK
                .contains(&ip)
                .then(|| u16::from_str_radix(port, 16).ok())
                .flatten()
        })
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

type Dial = (u16, oneshot::Sender<std::io::Result<std::net::TcpStream>>);

/// A thread inside the namespace of `pid` that connects to its loopback ports.
fn dialer(pid: u32) -> std::io::Result<mpsc::Sender<Dial>> {
    let ns = File::open(format!("/proc/{pid}/ns/net"))?;
    let (tx, rx) = mpsc::channel::<Dial>();
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("netns-dialer".into())
        .spawn(move || {
            // SAFETY: setns on a descriptor we own; it changes this thread's namespace only.
            let entered = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            let _ = ready_tx.send(if entered == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            });
            if entered != 0 {
                return;
            }
            for (port, reply) in rx {
                let _ = reply.send(std::net::TcpStream::connect(("127.0.0.1", port)));
            }
        })?;
    ready_rx
        .recv()
        .map_err(|_| std::io::Error::other("the dialer thread ended"))??;
    Ok(tx)
}

/// Until `pid` exits: every loopback port it listens on answers on the same port here (when free
/// here), each connection forwarded to it inside its namespace. `on_taken` hears of a port that
/// is taken here, once.
pub async fn mirror_loopback(pid: u32, on_taken: impl Fn(u16)) -> std::io::Result<()> {
    let dial = dialer(pid)?;
    let mut mirrored: HashMap<u16, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut taken = std::collections::HashSet::new();
    while Path::new(&format!("/proc/{pid}")).exists() {
        let ports = listening_ports(pid);
        mirrored.retain(|port, task| {
            let keep = ports.contains(port);
            if !keep {
                task.abort();
            }
            keep
        });
        for port in ports {
            if mirrored.contains_key(&port) || taken.contains(&port) {
                continue;
            }
            match TcpListener::bind(("127.0.0.1", port)).await {
                Ok(listener) => {
                    mirrored.insert(port, tokio::spawn(forward(listener, port, dial.clone())));
                }
                Err(_) => {
                    taken.insert(port);
                    on_taken(port);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for (_, task) in mirrored {
        task.abort();
    }
    Ok(())
}

async fn forward(listener: TcpListener, port: u16, dial: mpsc::Sender<Dial>) {
    while let Ok((mut inbound, _)) = listener.accept().await {
        let dial = dial.clone();
        tokio::spawn(async move {
            let (tx, rx) = oneshot::channel();
            if dial.send((port, tx)).is_err() {
                return;
            }
            let Ok(Ok(stream)) = rx.await else {
                return;
            };
            if stream.set_nonblocking(true).is_err() {
                return;
            }
            if let Ok(mut outbound) = TcpStream::from_std(stream) {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_listeners_are_mirrored() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n\
   1: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1\n\
   2: 0100580A:2710 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1\n\
   3: 0100007F:1F91 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4 1\n";
        assert_eq!(parse_listening(table), vec![80, 8080]);
        let v6 = "  sl  local_address remote_address st\n\
   0: 00000000000000000000000000000000:5DC0 00000000000000000000000000000000:0000 0A 0\n\
   1: 00000000000000000000000001000000:0051 00000000000000000000000000000000:0000 0A 0\n";
        assert_eq!(
            parse_listening(v6),
            vec![24000],
            "not ::1, which 127.0.0.1 does not reach"
        );
    }
}
