//! Figures read from an API server's `/metrics`. (The operator's are read in `tenantplane-local`,
//! which knows the operator.)

use std::collections::BTreeMap;

/// The kinds the syncer watches on the host, by the resource names the API server's metrics use.
pub const SYNCED_RESOURCES: &[&str] = &[
    "pods",
    "services",
    "endpoints",
    "configmaps",
    "secrets",
    "persistentvolumeclaims",
    "serviceaccounts",
    "ingresses",
    "nodes",
    "events",
    "storageclasses",
    "ingressclasses",
];

/// Open WATCH requests by resource (`apiserver_longrunning_requests{verb="WATCH"}`).
pub async fn open_watches(client: &kube::Client) -> crate::Result<BTreeMap<String, f64>> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| crate::Error::Client(tenantplane_client::error_chain(&e)))?;
    let text = client.request_text(request).await?;
    Ok(parse_open_watches(&text))
}

/// The sum over [`SYNCED_RESOURCES`] of [`open_watches`].
pub fn synced_watches(watches: &BTreeMap<String, f64>) -> f64 {
    SYNCED_RESOURCES
        .iter()
        .filter_map(|r| watches.get(*r))
        .sum()
}

/// Parse the Prometheus text for the open WATCH requests, summed by resource.
pub fn parse_open_watches(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_longrunning_requests{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        if !labels.contains("verb=\"WATCH\"") {
            continue;
        }
        let resource = labels
            .split(',')
            .find_map(|l| l.strip_prefix("resource=\""))
            .map(|r| r.trim_end_matches('"').to_string())
            .unwrap_or_default();
        if let Ok(v) = value.trim().parse::<f64>() {
            *out.entry(resource).or_insert(0.0) += v;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_are_summed_by_resource() {
        let text = r#"# HELP apiserver_longrunning_requests x
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="WATCH"} 3
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="namespace",subresource="",verb="WATCH"} 2
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="namespace",subresource="log",verb="CONNECT"} 1
apiserver_longrunning_requests{component="apiserver",group="storage.k8s.io",resource="storageclasses",scope="cluster",subresource="",verb="WATCH"} 1
"#;
        let w = parse_open_watches(text);
        assert_eq!(w["pods"], 5.0);
        assert_eq!(synced_watches(&w), 6.0);
    }
}
