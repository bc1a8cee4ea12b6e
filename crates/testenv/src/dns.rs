//! A DNS client for tests: one A query over UDP, as a pod's resolver sends it.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use crate::{Error, Result};

/// What a server answered for one name.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    /// The response code: 0 NOERROR, 2 SERVFAIL, 3 NXDOMAIN …
    pub rcode: u8,
    /// The A records of the answer.
    pub addresses: Vec<Ipv4Addr>,
}

/// Ask `server` for the A records of `name` (fully qualified, with or without the last dot).
pub async fn lookup_a(server: SocketAddr, name: &str) -> Result<Answer> {
    let name = name.to_string();
    tokio::task::spawn_blocking(move || lookup_a_blocking(server, &name))
        .await
        .map_err(|e| Error::Io(format!("DNS lookup task: {e}")))?
}

fn lookup_a_blocking(server: SocketAddr, name: &str) -> Result<Answer> {
    let id = (std::process::id() as u16) ^ (name.len() as u16).rotate_left(7);
    let query = encode_query(id, name)?;
    let socket = UdpSocket::bind(("127.0.0.1", 0))?;
    socket.set_read_timeout(Some(Duration::from_secs(3)))?;
    socket.send_to(&query, server)?;
    let mut buf = [0u8; 1500];
    loop {
        let (n, _) = socket
            .recv_from(&mut buf)
            .map_err(|e| Error::Io(format!("no answer from {server} for {name}: {e}")))?;
        if n >= 2 && u16::from_be_bytes([buf[0], buf[1]]) == id {
            return decode_answer(&buf[..n]);
        }
    }
}

/// A standard query with recursion desired, one question: `name` IN A.
pub fn encode_query(id: u16, name: &str) -> Result<Vec<u8>> {
    let mut q = Vec::with_capacity(64);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(Error::Io(format!("{name:?} is not a DNS name")));
        }
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&[0, 1, 0, 1]);
    Ok(q)
}

/// The response code and the A records of a response.
pub fn decode_answer(msg: &[u8]) -> Result<Answer> {
    let short = || Error::Io("the DNS answer is cut short".to_string());
    if msg.len() < 12 {
        return Err(short());
    }
    let rcode = msg[3] & 0x0f;
    let questions = u16::from_be_bytes([msg[4], msg[5]]);
    let answers = u16::from_be_bytes([msg[6], msg[7]]);
    let mut at = 12;
    for _ in 0..questions {
        at = skip_name(msg, at).ok_or_else(short)? + 4;
    }
    let mut addresses = Vec::new();
    for _ in 0..answers {
        at = skip_name(msg, at).ok_or_else(short)?;
        let header = msg.get(at..at + 10).ok_or_else(short)?;
        let (kind, class) = (
            u16::from_be_bytes([header[0], header[1]]),
            u16::from_be_bytes([header[2], header[3]]),
        );
        let len = u16::from_be_bytes([header[8], header[9]]) as usize;
        let data = msg.get(at + 10..at + 10 + len).ok_or_else(short)?;
        if kind == 1 && class == 1 && len == 4 {
            addresses.push(Ipv4Addr::new(data[0], data[1], data[2], data[3]));
        }
        at += 10 + len;
    }
    Ok(Answer { rcode, addresses })
}

/// The offset after the (possibly compressed) name at `at`.
fn skip_name(msg: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let len = *msg.get(at)?;
        match len {
            0 => return Some(at + 1),
            l if l & 0xc0 == 0xc0 => return Some(at + 2),
            l => at += 1 + l as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_names_one_question_for_an_a_record() {
        let q = encode_query(0x1234, "web.default.svc.cluster.local.").unwrap();
        assert_eq!(&q[..4], &[0x12, 0x34, 0x01, 0x00]);
        assert_eq!(&q[4..6], &[0, 1]);
        assert_eq!(&q[12..16], b"\x03web");
        assert_eq!(&q[q.len() - 5..], &[0, 0, 1, 0, 1]);
        assert!(encode_query(1, "a..b").is_err());
    }

    #[test]
    fn an_answer_gives_its_code_and_addresses() {
        // The query, turned into a response with two A records (one by a compressed name) and a
        // CNAME that is not an address.
        let mut m = encode_query(7, "web.default.svc.cluster.local").unwrap();
        m[2] = 0x81;
        m[3] = 0x80;
        m[7] = 3;
        for (kind, data) in [
            (1u16, vec![10, 96, 0, 12]),
            (5, vec![3, b'w', b'e', b'b', 0]),
            (1, vec![10, 96, 0, 13]),
        ] {
            m.extend_from_slice(&[0xc0, 12]);
            m.extend_from_slice(&kind.to_be_bytes());
            m.extend_from_slice(&[0, 1, 0, 0, 0, 30]);
            m.extend_from_slice(&(data.len() as u16).to_be_bytes());
            m.extend_from_slice(&data);
        }
        let a = decode_answer(&m).unwrap();
        assert_eq!(a.rcode, 0);
        assert_eq!(
            a.addresses,
            [Ipv4Addr::new(10, 96, 0, 12), Ipv4Addr::new(10, 96, 0, 13)]
        );
        m[3] = 0x83;
        assert_eq!(decode_answer(&m[..m.len() - 2]).map(|a| a.rcode).ok(), None);
        assert!(decode_answer(&m[..5]).is_err());
    }
}
