//! The names this engine gives Kubernetes objects and label values: pure
//! functions of the job id and attempt, kept apart because every object and
//! every lookup (the engine's `status`, `cancel`, `logs`) depends on them
//! agreeing, and because ids come from users and must never reach a URL or
//! a label unchecked.

use sha2::{Digest, Sha256};

/// Pods of an Indexed Job get the hostname `<job name>-<index>`, which must
/// be a DNS label (≤ 63): 52 leaves room for any index.
pub const MAX_NAME_LEN: usize = 52;

/// Is `s` a DNS-1123 label (what namespaces and our object names must be)?
pub fn is_dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS subdomain (RFC 1123): dot-separated labels, at most 253 bytes;
/// what a Secret's name must be.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

fn short_hash(s: &str) -> String {
    hex::encode(&Sha256::digest(s.as_bytes())[..4])
}

/// Lowercase alphanumerics and `-`, no runs of `-`, none at the ends.
fn dns_chars(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_string()
}

/// The name of an attempt's Job and Service: `<job id>-<attempt>` (job ids
/// are the spec's name plus a random suffix, so they are unique and
/// readable). An id that is not usable as is (characters, length, a leading
/// digit: Service names must start with a letter) is cleaned up, cut, and
/// given a hash of the original, so distinct ids keep distinct names.
pub fn object_name(job_id: &str, attempt: u32) -> String {
    let suffix = format!("-{attempt}");
    let clean = dns_chars(job_id);
    let usable = clean == job_id
        && clean.starts_with(|c: char| c.is_ascii_lowercase())
        && clean.len() + suffix.len() <= MAX_NAME_LEN;
    if usable {
        return format!("{clean}{suffix}");
    }
    let hash = short_hash(job_id);
    let mut base = clean;
    if !base.starts_with(|c: char| c.is_ascii_lowercase()) {
        base.insert_str(0, "j-");
    }
    let room = MAX_NAME_LEN - suffix.len() - hash.len() - 1;
    base.truncate(room);
    let base = base.trim_end_matches('-');
    format!("{base}-{hash}{suffix}")
}

/// `s` as a label value (≤ 63 of `[A-Za-z0-9._-]`, alphanumeric at both
/// ends), with a hash of `s` when it had to change.
pub fn label_value(s: &str) -> String {
    let ok = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    let valid = s.len() <= 63
        && s.bytes().all(ok)
        && s.bytes().next().is_none_or(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_none_or(|b| b.is_ascii_alphanumeric());
    if valid {
        return s.to_string();
    }
    let mut clean: String = s
        .bytes()
        .map(|b| if ok(b) { char::from(b) } else { '-' })
        .collect();
    clean.truncate(63 - 9);
    let clean = clean.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if clean.is_empty() {
        short_hash(s)
    } else {
        format!("{clean}-{}", short_hash(s))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn secret_names_are_dns_subdomains() {
        for ok in ["acme", "acme-registry", "a.b-c.d", &"a".repeat(63)] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        for bad in [
            "",
            "Acme",
            "a..b",
            ".a",
            "a_b",
            &"a".repeat(64),
            &["a"; 128].join("."),
        ] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn object_names_are_dns_labels_short_enough_for_pod_hostnames() {
        let long = "x".repeat(63) + "-0123abcd";
        let cases: Vec<(&str, u32, Option<&str>)> = vec![
            ("train-1a2b3c4d", 1, Some("train-1a2b3c4d-1")),
            ("train-1a2b3c4d", 12, Some("train-1a2b3c4d-12")),
            ("Train_Run.7", 1, None),
            ("7-runs-0000aaaa", 1, None),
            ("", 1, None),
            ("---", 4294967295, None),
            (&long, 4294967295, None),
            ("ü-only-ünicode", 1, None),
        ];
        let mut seen = HashSet::new();
        for (id, attempt, want) in cases {
            let name = object_name(id, attempt);
            assert!(is_dns_label(&name), "{id:?} -> {name:?}");
            assert!(name.len() <= MAX_NAME_LEN, "{name}");
            assert!(name.starts_with(|c: char| c.is_ascii_lowercase()), "{name}");
            assert!(name.ends_with(&format!("-{attempt}")), "{name}");
            assert!(
                is_dns_label(&format!("{name}-{}", u32::MAX)),
                "the hostname of any pod index fits"
            );
            if let Some(w) = want {
                assert_eq!(name, w);
            }
            assert!(
                seen.insert(name.clone()),
                "distinct ids, distinct names: {name}"
            );
            assert_eq!(name, object_name(id, attempt), "deterministic");
        }
        // Ids that clean up to the same text still differ.
        assert_ne!(object_name("a_b-1", 1), object_name("a.b-1", 1));
        assert_ne!(object_name(&long, 1), object_name(&(long.clone() + "x"), 1));
    }

    #[test]
    fn label_values_table() {
        for (raw, want) in [
            ("train-1a2b3c4d", Some("train-1a2b3c4d")),
            ("A.b_c-9", Some("A.b_c-9")),
            ("", Some("")),
            ("-x", None),
            ("a b", None),
            (&*"y".repeat(70), None),
        ] {
            let v = label_value(raw);
            let ok = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
            assert!(v.len() <= 63 && v.bytes().all(ok), "{raw:?} -> {v:?}");
            assert!(
                v.is_empty()
                    || (v.starts_with(|c: char| c.is_ascii_alphanumeric())
                        && v.ends_with(|c: char| c.is_ascii_alphanumeric())),
                "{v}"
            );
            if let Some(w) = want {
                assert_eq!(v, w);
            } else {
                assert!(v.ends_with(&short_hash(raw)), "{v}");
            }
        }
    }
}
