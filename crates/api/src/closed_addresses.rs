//! Addresses no tenant pod reaches, whatever its profile or egress policy: link-local ranges and
//! the cloud metadata and identity endpoints, in both address families. They hand out the node's
//! credentials and identity, so one request from a tenant pod would be a host compromise. This
//! is the one list; every egress rule the operator writes leaves it out.

use std::net::{IpAddr, Ipv6Addr};

use crate::cidr::Cidr;

/// The list, each with where it is documented.
pub const CLOSED: &[(&str, &str)] = &[
    // RFC 3927 IPv4 link-local. Holds the metadata address 169.254.169.254 of AWS (IMDS),
    // GCP (metadata.google.internal), Azure (IMDS), Oracle (IMDS), OpenStack (Nova metadata),
    // DigitalOcean, Hetzner, Linode/Akamai and IBM Cloud, and also AWS's DNS 169.254.169.253,
    // NTP 169.254.169.123, ECS task credentials 169.254.170.2 and EKS Pod Identity
    // 169.254.170.23, Scaleway's 169.254.42.42, Tencent's 169.254.0.23, GKE's metadata proxy
    // 169.254.169.252 and NodeLocal DNSCache 169.254.20.10 (node-local, not the tenant's).
    // https://www.rfc-editor.org/rfc/rfc3927
    // https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html
    // https://cloud.google.com/compute/docs/metadata/querying-metadata
    // https://learn.microsoft.com/azure/virtual-machines/instance-metadata-service
    // https://docs.oracle.com/iaas/Content/Compute/Tasks/gettingmetadata.htm
    // https://docs.openstack.org/nova/latest/user/metadata.html
    // https://docs.digitalocean.com/reference/api/metadata/
    (
        "169.254.0.0/16",
        "link-local (IPv4): cloud metadata and identity endpoints",
    ),
    // RFC 4291 IPv6 link-local. Holds OpenStack's metadata fe80::a9fe:a9fe.
    // https://docs.openstack.org/neutron/latest/admin/config-ipv6.html (metadata over IPv6)
    ("fe80::/10", "link-local (IPv6): cloud metadata endpoints"),
    // AWS's instance-local services over IPv6: IMDS fd00:ec2::254, Route 53 Resolver
    // fd00:ec2::253, Time Sync fd00:ec2::123, EKS Pod Identity Agent fd00:ec2::23.
    // https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html
    // https://docs.aws.amazon.com/eks/latest/userguide/pod-id-agent-setup.html
    (
        "fd00:ec2::/32",
        "AWS instance metadata, DNS, time and EKS Pod Identity (IPv6)",
    ),
    // GCP's metadata server on IPv6-only instances.
    // https://cloud.google.com/compute/docs/metadata/querying-metadata
    ("fd20:ce::254/128", "GCP metadata server (IPv6)"),
    // Azure's WireServer: VM agent, extensions, health probes and DNS; not link-local.
    // https://learn.microsoft.com/azure/virtual-network/what-is-ip-address-168-63-129-16
    ("168.63.129.16/32", "Azure WireServer"),
    // Alibaba Cloud's ECS metadata service (inside 100.64.0.0/10, not link-local).
    // https://www.alibabacloud.com/help/en/ecs/user-guide/view-instance-metadata
    ("100.100.100.200/32", "Alibaba Cloud ECS metadata"),
    // Oracle Cloud: the Classic metadata address, and IMDS over IPv6.
    // https://docs.oracle.com/iaas/Content/Compute/Tasks/gettingmetadata.htm
    ("192.0.0.192/32", "Oracle Cloud metadata (Classic)"),
    ("fd00:c1::a9fe:a9fe/128", "Oracle Cloud IMDS (IPv6)"),
    // Scaleway's and Linode/Akamai's metadata services over IPv6.
    // https://www.scaleway.com/en/docs/instances/ (instance metadata)
    // https://techdocs.akamai.com/cloud-computing/docs/overview-of-the-metadata-service
    ("fd00:42::42/128", "Scaleway metadata (IPv6)"),
    ("fd00:a9fe:a9fe::1/128", "Linode/Akamai metadata (IPv6)"),
];

/// RFC 6052's well-known NAT64 prefix: through a node-local NAT64, `64:ff9b::a9fe:a9fe` is
/// 169.254.169.254 seen from the node. Every IPv4 entry is closed in that form too.
/// https://www.rfc-editor.org/rfc/rfc6052
const NAT64: Ipv6Addr = Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0);

/// Every closed block: the list, and its IPv4 entries in their NAT64 form.
pub fn closed() -> Vec<Cidr> {
    let listed: Vec<Cidr> = CLOSED.iter().filter_map(|(c, _)| Cidr::parse(c)).collect();
    let nat64 = listed.iter().filter_map(|c| match c.network() {
        IpAddr::V4(v4) => {
            let embedded = u128::from(NAT64) | u128::from(u32::from(v4));
            Some(Cidr::new(
                IpAddr::V6(Ipv6Addr::from(embedded)),
                96 + c.prefix(),
            ))
        }
        IpAddr::V6(_) => None,
    });
    let mut all = listed.clone();
    all.extend(nat64);
    all
}

/// Is `ip` closed?
pub fn is_closed(ip: IpAddr) -> bool {
    closed().iter().any(|c| c.contains(ip))
}

/// An egress `ipBlock` for `cidr` that leaves the closed blocks out: the blocks to put in its
/// `except` (those strictly inside it, as the API requires), or `None` when all of `cidr` is
/// closed and no block may be written for it.
pub fn egress_block(cidr: &Cidr) -> Option<Vec<Cidr>> {
    let closed = closed();
    if closed.iter().any(|c| c.covers(cidr)) {
        return None;
    }
    let mut except: Vec<Cidr> = closed.into_iter().filter(|c| cidr.covers(c)).collect();
    except.sort();
    Some(except)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_list_parses_and_closes_every_known_endpoint_in_both_families() {
        assert_eq!(
            closed().len(),
            CLOSED.len() + CLOSED.iter().filter(|(c, _)| !c.contains(':')).count(),
            "every entry parses"
        );
        for endpoint in [
            "169.254.169.254",
            "169.254.170.2",
            "169.254.170.23",
            "169.254.169.253",
            "168.63.129.16",
            "100.100.100.200",
            "192.0.0.192",
            "fd00:ec2::254",
            "fd00:ec2::23",
            "fd00:ec2::253",
            "fd00:ec2::123",
            "fd20:ce::254",
            "fd00:c1::a9fe:a9fe",
            "fe80::a9fe:a9fe",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::a83f:8110",
            "64:ff9b::6464:64c8",
        ] {
            assert!(is_closed(ip(endpoint)), "{endpoint}");
        }
        for open in [
            "10.96.0.10",
            "8.8.8.8",
            "100.100.100.201",
            "2001:db8::1",
            "fd00:ec3::1",
        ] {
            assert!(!is_closed(ip(open)), "{open}");
        }
    }

    #[test]
    fn an_egress_block_excepts_what_it_holds_and_is_dropped_when_all_closed() {
        let cidr = |s: &str| Cidr::parse(s).unwrap();
        let strings = |v: Vec<Cidr>| v.iter().map(Cidr::to_string).collect::<Vec<_>>();
        let v4 = strings(egress_block(&cidr("0.0.0.0/0")).unwrap());
        assert_eq!(
            v4,
            [
                "100.100.100.200/32",
                "168.63.129.16/32",
                "169.254.0.0/16",
                "192.0.0.192/32"
            ]
        );
        let v6 = strings(egress_block(&cidr("::/0")).unwrap());
        for needed in [
            "fe80::/10",
            "fd00:ec2::/32",
            "fd20:ce::254/128",
            "64:ff9b::a9fe:0/112",
        ] {
            assert!(v6.contains(&needed.to_string()), "{needed}: {v6:?}");
        }
        assert!(v6.iter().all(|c| c.contains(':')), "one family per block");
        // A block that holds none is written as it is; one inside a closed block not at all.
        assert_eq!(egress_block(&cidr("203.0.113.0/24")), Some(vec![]));
        assert_eq!(
            strings(egress_block(&cidr("100.64.0.0/10")).unwrap()),
            ["100.100.100.200/32"]
        );
        assert_eq!(egress_block(&cidr("169.254.169.254/32")), None);
        assert_eq!(egress_block(&cidr("169.254.0.0/16")), None);
        assert_eq!(egress_block(&cidr("fd00:ec2::254/128")), None);
        assert_eq!(egress_block(&cidr("168.63.129.16/32")), None);
    }
}
