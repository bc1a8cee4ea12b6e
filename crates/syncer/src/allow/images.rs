//! Where a tenant pod's images come from. A host node pulls with its own credentials too (a
//! cloud's credential provider, a registry login on the node), whatever pull secrets the pod
//! names: an image of a registry only the nodes reach would run, with what is baked into it, on
//! the platform's rights. So a profile that lists registries admits images of those only.

use k8s_openapi::api::core::v1::PodSpec;
use tenantplane_api::Allowances;
use tenantplane_api::allowances::name_matches;

use super::values::listed;

/// The registry of a name without one, as container runtimes complete it.
const DEFAULT_REGISTRY: &str = "docker.io";

/// Why a pod's images may not be pulled on the host under `allow`; empty when they may (or when
/// the profile lists no registries, which admits any). An ephemeral container is judged on its
/// own, as a pod's only container (`kinds::pods::ephemeral`).
pub fn image_refusals(allow: &Allowances, spec: &PodSpec) -> Vec<String> {
    let Some(allowed) = allow.image_registries.as_ref() else {
        return vec![];
    };
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers);
    let images = containers
        .map(|c| (format!("container {:?}", c.name), c.image.as_deref()))
        .chain(spec.volumes.iter().flatten().map(|v| {
            let reference = v.image.as_ref().and_then(|i| i.reference.as_deref());
            (format!("volume {:?}", v.name), reference)
        }));
    let mut out = Vec::new();
    for (who, image) in images {
        // No image: the API server refuses a pod container without one, an image volume too.
        let Some(image) = image.filter(|i| !i.is_empty()) else {
            continue;
        };
        let from = registry(image);
        if !allowed.iter().any(|p| registry_matches(p, &from)) {
            out.push(format!(
                "{who}: image {image:?} comes from registry {from}, not in the IsolationProfile's allow.imageRegistries{}",
                listed(allowed)
            ));
        }
    }
    out
}

/// The registry (`host[:port]`) an image reference pulls from, as container runtimes read it:
/// the first path component when it looks like a host (has a `.` or `:`, is `localhost`, or has
/// capitals, which a repository name may not), else `docker.io`. Lower-cased, as host names
/// compare.
pub fn registry(image: &str) -> String {
    let host = match image.split_once('/') {
        Some((first, _))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            first
        }
        _ => DEFAULT_REGISTRY,
    };
    let host = host.to_ascii_lowercase();
    // The runtimes' old name for Docker Hub: the same registry.
    if host == "index.docker.io" {
        DEFAULT_REGISTRY.into()
    } else {
        host
    }
}

/// Does `registry` match profile entry `pattern`: equal, or under a `*.example.com` domain
/// (`*.example.com:5000` for that port)?
fn registry_matches(pattern: &str, registry: &str) -> bool {
    name_matches(&pattern.to_ascii_lowercase(), registry)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_registry_of_an_image_is_read_as_runtimes_read_it() {
        for (image, want) in [
            ("nginx", "docker.io"),
            ("nginx:1.27", "docker.io"),
            ("nginx@sha256:0123", "docker.io"),
            ("library/nginx", "docker.io"),
            ("team/app:1", "docker.io"),
            ("localhost:5000", "docker.io"),
            ("docker.io/library/nginx", "docker.io"),
            ("index.docker.io/library/nginx", "docker.io"),
            ("registry-1.docker.io/library/nginx", "registry-1.docker.io"),
            ("localhost/app", "localhost"),
            ("localhost:5000/app", "localhost:5000"),
            ("registry:5000/app", "registry:5000"),
            ("[::1]:5000/app", "[::1]:5000"),
            ("ghcr.io/org/app:1", "ghcr.io"),
            ("Registry.Example/app", "registry.example"),
            ("Internal/app", "internal"),
            (
                "123456789012.dkr.ecr.eu-west-1.amazonaws.com/platform/deployer:1",
                "123456789012.dkr.ecr.eu-west-1.amazonaws.com",
            ),
        ] {
            assert_eq!(registry(image), want, "{image}");
        }
    }

    #[test]
    fn registries_match_exactly_or_under_a_domain() {
        assert!(registry_matches("ghcr.io", "ghcr.io"));
        assert!(registry_matches("GHCR.io", "ghcr.io"));
        assert!(!registry_matches("ghcr.io", "ghcr.io:443"));
        assert!(registry_matches("*.example.com", "r.example.com"));
        assert!(!registry_matches("*.example.com", "example.com"));
        assert!(!registry_matches("*.example.com", "r.example.com:5000"));
        assert!(registry_matches("*.example.com:5000", "r.example.com:5000"));
        assert!(!registry_matches("*.amazonaws.com", "evilamazonaws.com"));
    }

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).unwrap()
    }

    const ECR: &str = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/platform/deployer:1";

    /// A pod with images from four registries, in containers and an image volume.
    pub(crate) fn pod_of_four_registries() -> PodSpec {
        spec(json!({
            "initContainers": [{"name": "init", "image": "busybox"}],
            "containers": [{"name": "web", "image": "ghcr.io/team/web:1"},
                           {"name": "deployer", "image": ECR}],
            "volumes": [{"name": "tools", "image": {"reference": "registry.internal:5000/tools:1"}},
                        {"name": "scratch", "emptyDir": {}}]
        }))
    }

    #[test]
    fn every_image_of_a_pod_comes_from_a_listed_registry() {
        let ecr = ECR;
        let pod = pod_of_four_registries();
        assert!(
            image_refusals(&Allowances::default(), &pod).is_empty(),
            "unset: any"
        );
        let allow = Allowances {
            image_registries: Some(vec!["ghcr.io".into()]),
            ..Default::default()
        };
        let text = image_refusals(&allow, &pod);
        assert_eq!(text.len(), 3, "{text:#?}");
        assert_eq!(
            text[0],
            "container \"init\": image \"busybox\" comes from registry docker.io, not in the IsolationProfile's allow.imageRegistries, which allows ghcr.io"
        );
        assert!(text[1].starts_with(&format!(
            "container \"deployer\": image {ecr:?} comes from registry 123456789012.dkr.ecr.eu-west-1.amazonaws.com,"
        )));
        assert!(text[2].starts_with("volume \"tools\": image \"registry.internal:5000/tools:1\" comes from registry registry.internal:5000,"));
        let all = Allowances {
            image_registries: Some(vec![
                "ghcr.io".into(),
                "docker.io".into(),
                "*.amazonaws.com".into(),
                "registry.internal:5000".into(),
            ]),
            ..Default::default()
        };
        assert!(image_refusals(&all, &pod).is_empty());
        let none = Allowances {
            image_registries: Some(vec![]),
            ..Default::default()
        };
        assert!(image_refusals(&none, &pod)[0].ends_with("allow.imageRegistries, which is empty"));
    }
}
