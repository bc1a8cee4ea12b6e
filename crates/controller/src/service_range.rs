//! The host's Service address range, asked of the host rather than trusted from a flag: a tenant
//! allocates its Services from the same range (they carry their host copies' cluster IPs), so
//! the range k3s is given must be the one the host really allocates from.
//!
//! Where the API has them, the `ServiceCIDR` objects say it. Otherwise the API server's refusal
//! of an address outside its range names the range (a dry run: nothing is created).

use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use tenantplane_api::cidr::Cidr;

/// How long a discovered range is trusted before it is asked for again.
pub const REDISCOVER_AFTER: Duration = Duration::from_secs(300);

/// An address no host's Service range holds, for the dry run: TEST-NET-1 (RFC 5737).
const PROBE_ADDRESS: &str = "192.0.2.1";

/// What the host said its Service ranges are, and how it said so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRange {
    /// The ranges, as CIDRs.
    pub cidrs: Vec<String>,
    /// For messages: `ServiceCIDR kubernetes` or `the API server's answer to a Service at …`.
    pub source: String,
}

/// Why the host's Service range is not known, or disagrees with the API Service or the flag.
/// [`label`](Self::label) is the reason the tenant's `Ready` condition shows.
#[derive(Debug, thiserror::Error)]
pub enum RangeError {
    /// The host's ServiceCIDR objects could not be listed.
    #[error("listing the host's ServiceCIDRs: {0}")]
    List(#[source] kube::Error),
    /// The host accepted a Service at an address no range should hold: its range cannot be told.
    #[error(
        "the host accepts a Service at {PROBE_ADDRESS}, so its Service range cannot be told apart; start the operator with --service-cidr"
    )]
    Accepted,
    /// The host refused that Service without naming its range: what it said.
    #[error(
        "the host refused a Service at {PROBE_ADDRESS} without naming its range ({0}); start the operator with --service-cidr"
    )]
    Unnamed(String),
    /// The dry-run Service request failed.
    #[error("asking the host for its Service range: {0}")]
    Ask(#[source] kube::Error),
    /// The API Service's address is outside the host's range.
    #[error(
        "the API Service's address {api_ip} is outside the host's Service range {} ({}); the host's Service allocation is inconsistent",
        range.cidrs.join(", "),
        range.source
    )]
    Outside {
        /// The API Service's address.
        api_ip: String,
        /// The host's range.
        range: HostRange,
    },
    /// `--service-cidr` names another range than the one the host allocates from.
    #[error(
        "--service-cidr is {flag} but the host allocates Services from {found} ({}), where the API Service got {api_ip}; drop the flag or set it to {found}",
        range.source
    )]
    FlagDisagrees {
        /// The flag's value.
        flag: String,
        /// The range the host allocates from.
        found: String,
        /// The API Service's address.
        api_ip: String,
        /// The host's range, and how it said so.
        range: HostRange,
    },
}

impl RangeError {
    /// A stable name: the `Ready` condition's reason.
    pub fn label(&self) -> &'static str {
        match self {
            RangeError::List(_)
            | RangeError::Accepted
            | RangeError::Unnamed(_)
            | RangeError::Ask(_) => "ServiceCIDRUnknown",
            RangeError::Outside { .. } | RangeError::FlagDisagrees { .. } => "ServiceCIDRMismatch",
        }
    }
}

/// Remembers the last discovery for [`REDISCOVER_AFTER`].
#[derive(Default)]
pub struct Discovery {
    last: Mutex<Option<(Instant, HostRange)>>,
}

impl Discovery {
    /// Forget what was remembered: the next [`host_range`](Self::host_range) asks the host.
    pub fn forget(&self) {
        if let Ok(mut last) = self.last.lock() {
            *last = None;
        }
    }

    /// The host's ranges: remembered, or asked for now. An error says what the host answered.
    pub async fn host_range(
        &self,
        client: &Client,
        namespace: &str,
    ) -> Result<HostRange, RangeError> {
        if let Ok(last) = self.last.lock()
            && let Some((at, range)) = last.as_ref()
            && at.elapsed() < REDISCOVER_AFTER
        {
            return Ok(range.clone());
        }
        let range = discover(client, namespace).await?;
        if let Ok(mut last) = self.last.lock() {
            *last = Some((Instant::now(), range.clone()));
        }
        Ok(range)
    }
}

/// Ask the host: its ServiceCIDR objects, else a dry-run Service at an address outside any range.
pub async fn discover(client: &Client, namespace: &str) -> Result<HostRange, RangeError> {
    let api: Api<ServiceCIDR> = Api::all(client.clone());
    match api.list(&ListParams::default()).await {
        Ok(list) => {
            let mut cidrs = Vec::new();
            let mut names = Vec::new();
            // Every one, terminating ones too: their addresses are still in use.
            for object in &list.items {
                names.push(object.name_any());
                cidrs.extend(
                    object
                        .spec
                        .iter()
                        .flat_map(|s| s.cidrs.iter().flatten().cloned()),
                );
            }
            if !cidrs.is_empty() {
                return Ok(HostRange {
                    cidrs,
                    source: format!("ServiceCIDR {}", names.join(", ")),
                });
            }
        }
        // An API server without the ServiceCIDR API (before Kubernetes 1.33, or with it off).
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(RangeError::List(e)),
    }
    from_refusal(client, namespace).await
}

/// A dry-run Service at [`PROBE_ADDRESS`]: the refusal names the valid range.
pub async fn from_refusal(client: &Client, namespace: &str) -> Result<HostRange, RangeError> {
    let api: Api<Service> = Api::namespaced(client.clone(), namespace);
    let probe = Service {
        metadata: kube::api::ObjectMeta {
            generate_name: Some("tenantplane-service-range-".into()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
            cluster_ip: Some(PROBE_ADDRESS.into()),
            ports: Some(vec![k8s_openapi::api::core::v1::ServicePort {
                port: 443,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let source = format!("the host API server's answer to a Service at {PROBE_ADDRESS}");
    match api.create(&params, &probe).await {
        Ok(_) => Err(RangeError::Accepted),
        Err(kube::Error::Api(e)) => match range_in_refusal(&e.message) {
            Some(cidrs) => Ok(HostRange { cidrs, source }),
            None => Err(RangeError::Unnamed(e.message.clone())),
        },
        Err(e) => Err(RangeError::Ask(e)),
    }
}

/// The CIDRs after "range of valid IPs is" in an API server's refusal.
pub fn range_in_refusal(message: &str) -> Option<Vec<String>> {
    let lower = message.to_ascii_lowercase();
    let at = lower.find("range of valid ips is")? + "range of valid ips is".len();
    let cidrs: Vec<String> = message[at..]
        .split(|c: char| c.is_whitespace() || c == ',')
        .map(|w| {
            w.trim_matches(|c: char| !(c.is_ascii_hexdigit() || c == ':' || c == '.' || c == '/'))
                .trim_end_matches('.')
        })
        .filter(|w| parse_cidr(w).is_some())
        .map(String::from)
        .collect();
    (!cidrs.is_empty()).then_some(cidrs)
}

/// `10.96.0.0/12` as a range; a bare address is not one here.
pub fn parse_cidr(cidr: &str) -> Option<Cidr> {
    cidr.contains('/').then(|| Cidr::parse(cidr)).flatten()
}

/// The address the tenant's `kubernetes` Service gets in `cidr` (the first of a dual-stack pair).
pub fn first_address(cidr: &str) -> Option<String> {
    let first = cidr.split(',').next()?;
    Some(parse_cidr(first)?.first_address()?.to_string())
}

/// Whether `ip` is inside `cidr`.
pub fn contains(cidr: &str, ip: &str) -> bool {
    let ip = ip.parse::<IpAddr>().ok();
    parse_cidr(cidr)
        .zip(ip)
        .is_some_and(|(c, ip)| c.contains(ip))
}

/// The range k3s gets: the host's range that holds the API Service's address. `flag` (the
/// operator's `--service-cidr`, one CIDR or a dual-stack pair, comma-separated) is a check: one
/// of its ranges must hold the address too (a wider one, as an older default, is fine). Otherwise
/// the sentence says what disagrees and what to fix.
pub fn choose(host: &HostRange, api_ip: &str, flag: Option<&str>) -> Result<String, RangeError> {
    let Some(found) = host.cidrs.iter().find(|c| contains(c, api_ip)) else {
        return Err(RangeError::Outside {
            api_ip: api_ip.to_string(),
            range: host.clone(),
        });
    };
    match flag {
        Some(flag) if !flag.split(',').map(str::trim).any(|c| contains(c, api_ip)) => {
            Err(RangeError::FlagDisagrees {
                flag: flag.to_string(),
                found: found.clone(),
                api_ip: api_ip.to_string(),
                range: host.clone(),
            })
        }
        _ => Ok(found.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(cidrs: &[&str]) -> HostRange {
        HostRange {
            cidrs: cidrs.iter().map(|c| c.to_string()).collect(),
            source: "ServiceCIDR kubernetes".into(),
        }
    }

    #[test]
    fn addresses_are_inside_or_outside_a_range() {
        assert!(contains("10.96.0.0/12", "10.96.0.1"));
        assert!(contains("10.96.0.0/12", "10.111.255.254"));
        assert!(!contains("10.96.0.0/12", "10.112.0.1"));
        assert!(!contains("10.96.0.0/12", "fd00::1"));
        assert!(contains("fd00:10:96::/112", "fd00:10:96::a"));
        assert!(!contains("fd00:10:96::/112", "fd00:10:97::a"));
        assert!(contains("0.0.0.0/0", "192.0.2.1"));
        assert!(!contains("not-a-cidr", "10.0.0.1"));
        assert!(!contains("10.0.0.0/33", "10.0.0.1"));
    }

    #[test]
    fn the_refusal_names_the_range() {
        let message = "Service \"x\" is invalid: spec.clusterIPs: Invalid value: [\"192.0.2.1\"]: failed to allocate IP 192.0.2.1: the provided IP (192.0.2.1) is not in the valid range. The range of valid IPs is 10.96.0.0/12";
        assert_eq!(
            range_in_refusal(message),
            Some(vec!["10.96.0.0/12".to_string()])
        );
        let dual = "... The range of valid IPs is 10.96.0.0/16, fd00:10:96::/112.";
        assert_eq!(
            range_in_refusal(dual),
            Some(vec![
                "10.96.0.0/16".to_string(),
                "fd00:10:96::/112".to_string()
            ])
        );
        assert_eq!(range_in_refusal("forbidden"), None);
    }

    #[test]
    fn the_flag_must_agree_with_the_host() {
        let h = host(&["10.96.0.0/12"]);
        assert_eq!(choose(&h, "10.96.0.20", None).unwrap(), "10.96.0.0/12");
        assert_eq!(
            choose(&h, "10.96.0.20", Some("10.96.0.0/12")).unwrap(),
            "10.96.0.0/12"
        );
        // Wider (the old default on a /16 host) or a dual-stack pair holding it: fine.
        assert_eq!(
            choose(&h, "10.96.0.20", Some("10.96.0.0/8")).unwrap(),
            "10.96.0.0/12"
        );
        assert_eq!(
            choose(&h, "10.96.0.20", Some("10.96.0.0/12, fd00::/108")).unwrap(),
            "10.96.0.0/12"
        );
        let wrong = choose(&h, "10.96.0.20", Some("10.200.0.0/16")).unwrap_err();
        assert_eq!(wrong.label(), "ServiceCIDRMismatch");
        let wrong = wrong.to_string();
        assert!(wrong.contains("--service-cidr is 10.200.0.0/16"), "{wrong}");
        assert!(wrong.contains("set it to 10.96.0.0/12"), "{wrong}");
        let outside = choose(&h, "172.16.0.1", None).unwrap_err();
        assert!(matches!(outside, RangeError::Outside { .. }), "{outside}");
        assert!(outside.to_string().contains("outside"), "{outside}");
        // Extended ranges: the one holding the address.
        let two = host(&["10.96.0.0/24", "10.97.0.0/24"]);
        assert_eq!(choose(&two, "10.97.0.9", None).unwrap(), "10.97.0.0/24");
    }
}
