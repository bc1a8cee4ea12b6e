//! Which k3s image runs a Kubernetes version. k3s tags its images `v<kubernetes>-k3s<N>`: most
//! patch releases are `-k3s1`, but a respin (`-k3s2`, `-k3s3`) replaces a first build that was
//! broken, and its `-k3s1` image, where one exists, is that broken build. So the tag comes from
//! this table, not from the version alone. A tenant pins any other image with
//! `spec.controlPlane.image`.

/// Kubernetes patch releases whose current k3s build is a respin, from k3s's release notes and
/// its channel server's history: `v1.30.2+k3s2`, `v1.30.14+k3s2`, `v1.35.0+k3s3`.
const RESPINS: &[(&str, u32)] = &[("v1.30.2", 2), ("v1.30.14", 2), ("v1.35.0", 3)];

/// The image tag of the k3s release that runs Kubernetes `version` (`v1.30.4` → `v1.30.4-k3s1`,
/// `v1.30.14` → `v1.30.14-k3s2`).
pub fn k3s_tag(version: &str) -> String {
    let build = RESPINS
        .iter()
        .find(|(v, _)| *v == version)
        .map_or(1, |(_, n)| *n);
    format!("{version}-k3s{build}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_respin_runs_its_latest_build_and_every_other_release_its_first() {
        assert_eq!(k3s_tag("v1.30.4"), "v1.30.4-k3s1");
        assert_eq!(k3s_tag("v1.30.14"), "v1.30.14-k3s2");
        assert_eq!(k3s_tag("v1.35.0"), "v1.35.0-k3s3");
        assert_eq!(k3s_tag("v1.36.1"), "v1.36.1-k3s1");
    }
}
