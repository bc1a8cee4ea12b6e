//! Address ranges (`10.96.0.0/12`, `fd00::/108`, or a bare address as its own range): parsed
//! once, compared as numbers, for the egress rules and the Service range's reserved addresses.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// A CIDR block, normalised to its network address. A thin wrapper over `ipnet` (parsing,
/// masking, containment) that adds what the project needs on top: a bare address is its own
/// block, and the `n`th address of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr(IpNet);

impl Cidr {
    /// The range's first address after its network address: what a Kubernetes API server gives
    /// its `kubernetes` Service in a service range.
    pub fn first_address(&self) -> Option<IpAddr> {
        match self.0 {
            IpNet::V4(n) if n.prefix_len() < 32 => {
                Some(IpAddr::V4(Ipv4Addr::from(u32::from(n.network()) + 1)))
            }
            IpNet::V6(n) if n.prefix_len() < 128 => {
                Some(IpAddr::V6(Ipv6Addr::from(u128::from(n.network()) + 1)))
            }
            _ => None,
        }
    }

    /// `addr/prefix`, or a bare address (a /32 or /128); `None` when it is neither.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let net = if text.contains('/') {
            text.parse::<IpNet>().ok()?
        } else {
            IpNet::from(text.parse::<IpAddr>().ok()?)
        };
        Some(Self(net.trunc()))
    }

    /// The block of `prefix` bits around `addr` (a prefix past the family's length is its full
    /// length).
    pub fn new(addr: IpAddr, prefix: u8) -> Self {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        // Cannot fail: the prefix is clamped to the family's length.
        let net = IpNet::new(addr, prefix.min(max)).unwrap_or_else(|_| IpNet::from(addr));
        Self(net.trunc())
    }

    /// The block's network address, its first.
    pub fn network(&self) -> IpAddr {
        self.0.network()
    }

    /// The block's prefix length in bits.
    pub fn prefix(&self) -> u8 {
        self.0.prefix_len()
    }

    /// Whether the block holds IPv4 addresses.
    pub fn is_ipv4(&self) -> bool {
        matches!(self.0, IpNet::V4(_))
    }

    /// Is `ip` inside this block?
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&ip)
    }

    /// Is all of `other` inside this block (equal included)?
    pub fn covers(&self, other: &Cidr) -> bool {
        self.0.contains(&other.0)
    }

    /// The address `n` past the network address (`None` past the block's end).
    pub fn nth(&self, n: u128) -> Option<IpAddr> {
        let size_bits = u32::from(self.0.max_prefix_len() - self.0.prefix_len());
        if size_bits < 128 && n >> size_bits != 0 {
            return None;
        }
        Some(match self.network() {
            IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) + u32::try_from(n).ok()?)),
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) + n)),
        })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network(), self.prefix())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn blocks_parse_normalise_and_contain() {
        let c = Cidr::parse("10.96.7.7/12").unwrap();
        assert_eq!(c.to_string(), "10.96.0.0/12");
        assert!(c.contains(ip("10.111.255.254")) && !c.contains(ip("10.112.0.1")));
        assert!(!c.contains(ip("::a60:1")), "families never mix");
        assert_eq!(
            Cidr::parse("192.0.2.7").unwrap().to_string(),
            "192.0.2.7/32"
        );
        assert_eq!(
            Cidr::parse("FD00:EC2::254").unwrap().to_string(),
            "fd00:ec2::254/128"
        );
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "x/8",
            "10.0.0.0/",
            "",
            "10.0.0.0/-1",
        ] {
            assert_eq!(Cidr::parse(bad), None, "{bad}");
        }
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains(ip("255.255.255.255")) && !all.contains(ip("::1")));
        assert!(Cidr::parse("::/0").unwrap().contains(ip("fe80::1")));
    }

    #[test]
    fn blocks_cover_smaller_ones_and_count_addresses() {
        let link_local = Cidr::parse("169.254.0.0/16").unwrap();
        assert!(link_local.covers(&Cidr::parse("169.254.169.254").unwrap()));
        assert!(link_local.covers(&link_local));
        assert!(
            !Cidr::parse("169.254.169.254/32")
                .unwrap()
                .covers(&link_local)
        );
        assert!(!link_local.covers(&Cidr::parse("fe80::/10").unwrap()));
        let range = Cidr::parse("10.96.0.0/16").unwrap();
        assert_eq!(range.nth(1), Some(ip("10.96.0.1")));
        assert_eq!(range.nth(10), Some(ip("10.96.0.10")));
        assert_eq!(range.nth(65535), Some(ip("10.96.255.255")));
        assert_eq!(range.nth(65536), None);
        let v6 = Cidr::parse("fd00:10:96::/112").unwrap();
        assert_eq!(v6.nth(10), Some(ip("fd00:10:96::a")));
        assert_eq!(
            Cidr::parse("::/0").unwrap().nth(u128::MAX),
            Some(ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"))
        );
    }
}
