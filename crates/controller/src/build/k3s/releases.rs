//! Which k3s image runs a Kubernetes version. k3s tags its images `v<kubernetes>-k3s<N>`: most
//! patch releases are `-k3s1`, but a respin (`-k3s2`, `-k3s3`) replaces a first build that was
//! broken, and its `-k3s1` image, where one exists, is that broken build. So the tag comes from
//! this table, not from the version alone. A tenant pins any other image with
//! `spec.controlPlane.image`.

/// Kubernetes patch releases of 1.30-1.36 whose current k3s build is a respin, from k3s's
/// release notes (k3s-io/docs, `docs/release-notes/v1.3X.X.md`), its GitHub releases and the
/// tags of k3s-io/k3s-upgrade, which tags every k3s release; read through September 2026 (v1.36.5,
/// v1.35.9, v1.34.12, v1.33.13, v1.32.13). The four `-k3s3` builds of February 2026 replaced
/// `-k3s1` with no `-k3s2`; v1.33.13's `-k3s2` is a rebuild after 1.33's last patch.
const RESPINS: &[(&str, u32)] = &[
    ("v1.30.2", 2),
    ("v1.30.14", 2),
    ("v1.32.11", 3),
    ("v1.33.7", 3),
    ("v1.33.13", 2),
    ("v1.34.3", 3),
    ("v1.35.0", 3),
];

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
        assert_eq!(k3s_tag("v1.32.11"), "v1.32.11-k3s3");
        assert_eq!(k3s_tag("v1.33.7"), "v1.33.7-k3s3");
        assert_eq!(k3s_tag("v1.33.13"), "v1.33.13-k3s2");
        assert_eq!(k3s_tag("v1.34.3"), "v1.34.3-k3s3");
        assert_eq!(k3s_tag("v1.35.0"), "v1.35.0-k3s3");
        assert_eq!(k3s_tag("v1.34.2"), "v1.34.2-k3s1");
        assert_eq!(k3s_tag("v1.36.1"), "v1.36.1-k3s1");
    }
}
