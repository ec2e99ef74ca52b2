//! `spec.model.uri`, parsed once for every reader: the Deployment builder, local mode and
//! the engine's `fetch-model` step.
//!
//! Two kinds of source:
//! - read in place: `file:///PATH`, `pvc://CLAIM/PATH`, `oci://IMAGE:TAG` (a volume or a
//!   path the engine opens itself);
//! - fetched before the engine starts: `s3://BUCKET/PREFIX` and `hf://ORG/NAME[@REVISION]`,
//!   downloaded into a cache folder by `tidegate-engine fetch-model` (an init container in a
//!   cluster, a step before the engine process in local mode).
//!
//! Invariant: [`cache_key`] is a pure function of the URI, so the operator knows where the
//! fetch step will put a model (the engine's `--model`) without running it, and two pools
//! naming the same URI share one cache folder.

/// A model URI, by scheme.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelUri<'a> {
    /// A path the engine opens itself (absolute in a cluster; local mode resolves a relative
    /// one against the manifests' folder).
    File(&'a str),
    /// A PersistentVolumeClaim and the path inside it.
    Pvc { claim: &'a str, path: &'a str },
    /// An OCI image whose files are the model.
    Oci(&'a str),
    /// Every object under `prefix` in `bucket` (an S3-compatible store).
    S3 { bucket: &'a str, prefix: &'a str },
    /// A Hugging Face model repository at a revision (a branch, tag or commit).
    Hf { repo: &'a str, revision: &'a str },
}

/// The revision of an `hf://` URI without `@REVISION`, as the hub has it.
pub const HF_DEFAULT_REVISION: &str = "main";

/// Why a model URI is refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "model URI {uri:?}: {why} (expected file://PATH, pvc://CLAIM/PATH, oci://IMAGE:TAG, s3://BUCKET/PREFIX or hf://ORG/NAME[@REVISION])"
)]
pub struct BadModelUri {
    pub uri: String,
    pub why: &'static str,
}

impl<'a> ModelUri<'a> {
    /// Parses `uri` by its scheme; the scheme's own rules are checked here for the fetched
    /// kinds (the in-place kinds are checked where they are mounted).
    pub fn parse(uri: &'a str) -> Result<Self, BadModelUri> {
        let bad = |why| BadModelUri {
            uri: uri.to_string(),
            why,
        };
        if let Some(p) = uri.strip_prefix("file://") {
            return Ok(ModelUri::File(p));
        }
        if let Some(rest) = uri.strip_prefix("pvc://") {
            let (claim, path) = rest.split_once('/').unwrap_or((rest, ""));
            return Ok(ModelUri::Pvc { claim, path });
        }
        if let Some(r) = uri.strip_prefix("oci://") {
            return Ok(ModelUri::Oci(r));
        }
        if let Some(rest) = uri.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(bad("no bucket"));
            }
            if prefix.split('/').any(|s| s == "..") {
                return Err(bad("`..` in the prefix"));
            }
            return Ok(ModelUri::S3 { bucket, prefix });
        }
        if let Some(rest) = uri.strip_prefix("hf://") {
            let (repo, revision) = match rest.split_once('@') {
                Some((repo, rev)) if !rev.is_empty() => (repo, rev),
                Some(_) => return Err(bad("an empty revision after @")),
                None => (rest, HF_DEFAULT_REVISION),
            };
            let parts: Vec<&str> = repo.split('/').collect();
            let name_ok = |s: &str| {
                !s.is_empty()
                    && s != ".."
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            };
            if parts.len() != 2 || !parts.iter().all(|s| name_ok(s)) {
                return Err(bad("the repository must be ORG/NAME"));
            }
            if revision.split('/').any(|s| s.is_empty() || s == "..") {
                return Err(bad("a malformed revision"));
            }
            return Ok(ModelUri::Hf { repo, revision });
        }
        Err(bad("unknown scheme"))
    }

    /// Whether the model is downloaded by the fetch step before the engine starts.
    pub fn is_fetched(&self) -> bool {
        matches!(self, ModelUri::S3 { .. } | ModelUri::Hf { .. })
    }
}

/// The folder name, under the model cache, of a fetched model: readable (the URI's own
/// characters where they are safe) and unique (a hash of the whole URI).
pub fn cache_key(uri: &str) -> String {
    let readable: String = uri
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let mut readable: String = readable.trim_matches('-').chars().take(80).collect();
    while readable.contains("--") {
        readable = readable.replace("--", "-");
    }
    format!("{readable}-{:016x}", fnv1a(uri.as_bytes()))
}

/// FNV-1a, 64 bits: stable across builds and platforms (std's hasher is not), and enough to
/// tell URIs apart in one cache folder.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_scheme_parses_to_its_kind() {
        assert_eq!(ModelUri::parse("file:///m"), Ok(ModelUri::File("/m")));
        assert_eq!(
            ModelUri::parse("pvc://w/a/b"),
            Ok(ModelUri::Pvc {
                claim: "w",
                path: "a/b"
            })
        );
        assert_eq!(
            ModelUri::parse("s3://models/smollm2/q4"),
            Ok(ModelUri::S3 {
                bucket: "models",
                prefix: "smollm2/q4"
            })
        );
        assert_eq!(
            ModelUri::parse("hf://HuggingFaceTB/SmolLM2-135M"),
            Ok(ModelUri::Hf {
                repo: "HuggingFaceTB/SmolLM2-135M",
                revision: "main"
            })
        );
        let hf = ModelUri::parse("hf://org/m@refs/pr/1").expect("hf");
        assert_eq!(
            hf,
            ModelUri::Hf {
                repo: "org/m",
                revision: "refs/pr/1"
            }
        );
        assert!(hf.is_fetched());
        assert!(!ModelUri::parse("oci://r/m:1").expect("oci").is_fetched());
    }

    #[test]
    fn malformed_fetched_uris_are_refused_with_the_reason() {
        for (uri, why) in [
            ("s3:///x", "no bucket"),
            ("s3://b/../etc", "`..`"),
            ("hf://justaname", "ORG/NAME"),
            ("hf://org/m@", "empty revision"),
            ("hf://org/../m", "ORG/NAME"),
            ("gs://b/p", "unknown scheme"),
        ] {
            let e = ModelUri::parse(uri).expect_err(uri);
            assert!(e.to_string().contains(why), "{uri}: {e}");
        }
    }

    #[test]
    fn the_cache_key_is_stable_readable_and_unique() {
        let a = cache_key("s3://models/smollm2");
        assert_eq!(a, cache_key("s3://models/smollm2"));
        assert!(a.starts_with("s3-models-smollm2-"), "{a}");
        assert_ne!(a, cache_key("s3://models/smollm2/"));
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    }
}
