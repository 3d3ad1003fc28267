//! `--artifact-url s3://bucket/prefix`: parsed and checked before anything
//! connects, so a typo is an error naming the part that is wrong, not a
//! 403 or a bucket nobody meant to write to.

use std::fmt;
use std::str::FromStr;

/// Longest prefix accepted: S3 keys are at most 1024 bytes, and ours add
/// `/partials/<32 hex>/<64 hex>` to it.
pub const MAX_PREFIX_LEN: usize = 512;

/// Where in S3 the artifacts live: a bucket and a key prefix (no leading
/// or trailing `/`; empty for the bucket's root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Location {
    pub bucket: String,
    pub prefix: String,
}

/// What is wrong with an artifact URL, and in which part of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("artifact-url: {field} `{value}`: {reason}")]
pub struct S3UrlError {
    /// `scheme`, `bucket` or `prefix`.
    pub field: &'static str,
    pub value: String,
    pub reason: String,
}

fn bad(field: &'static str, value: &str, reason: impl Into<String>) -> S3UrlError {
    S3UrlError {
        field,
        value: value.to_string(),
        reason: reason.into(),
    }
}

impl FromStr for S3Location {
    type Err = S3UrlError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(bad("scheme", url, "expected s3://bucket/prefix"));
        };
        if scheme != "s3" {
            return Err(bad(
                "scheme",
                scheme,
                "only s3:// is supported (the endpoint comes from AWS_ENDPOINT_URL)",
            ));
        }
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        check_bucket(bucket)?;
        let prefix = prefix.strip_suffix('/').unwrap_or(prefix);
        check_prefix(prefix)?;
        Ok(S3Location {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }
}

impl fmt::Display for S3Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "s3://{}", self.bucket)
        } else {
            write!(f, "s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

/// S3's general-purpose bucket naming rules (the ones a path-style
/// request and every S3-compatible server accept).
fn check_bucket(b: &str) -> Result<(), S3UrlError> {
    if !(3..=63).contains(&b.len()) {
        return Err(bad("bucket", b, "must be 3 to 63 characters"));
    }
    if !b
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
    {
        return Err(bad(
            "bucket",
            b,
            "only lowercase letters, digits, '.' and '-' (no credentials, ports or queries)",
        ));
    }
    let edge = |c: Option<u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !edge(b.bytes().next()) || !edge(b.bytes().last()) {
        return Err(bad(
            "bucket",
            b,
            "must begin and end with a letter or digit",
        ));
    }
    if b.contains("..") || b.contains(".-") || b.contains("-.") {
        return Err(bad("bucket", b, "no '..', '.-' or '-.'"));
    }
    if b.parse::<std::net::Ipv4Addr>().is_ok() {
        return Err(bad("bucket", b, "must not look like an IP address"));
    }
    Ok(())
}

/// Segments of `[A-Za-z0-9._-]`, none empty, `.` or `..`: keys that every
/// S3 server stores as written and no path normalisation can move.
fn check_prefix(p: &str) -> Result<(), S3UrlError> {
    if p.is_empty() {
        return Ok(());
    }
    if p.len() > MAX_PREFIX_LEN {
        return Err(bad(
            "prefix",
            p,
            format!("longer than {MAX_PREFIX_LEN} bytes"),
        ));
    }
    for seg in p.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." {
            return Err(bad("prefix", p, "empty, '.' or '..' segment"));
        }
        if !seg
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
        {
            return Err(bad(
                "prefix",
                p,
                "only letters, digits, '.', '_', '-' and '/' between segments",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_urls_and_their_parts() {
        for (url, bucket, prefix) in [
            ("s3://edgeloop", "edgeloop", ""),
            ("s3://edgeloop/", "edgeloop", ""),
            ("s3://my.bucket-1/a/b_c/D-1.x", "my.bucket-1", "a/b_c/D-1.x"),
            ("s3://abc/prod/", "abc", "prod"),
        ] {
            let loc: S3Location = url.parse().unwrap();
            assert_eq!((loc.bucket.as_str(), loc.prefix.as_str()), (bucket, prefix));
            assert_eq!(loc.to_string().parse::<S3Location>().unwrap(), loc, "{url}");
        }
    }

    #[test]
    fn refusals_name_the_field() {
        let long = format!("s3://bucket/{}", "a".repeat(MAX_PREFIX_LEN + 1));
        let long_bucket = format!("s3://{}", "b".repeat(64));
        for (url, field) in [
            ("edgeloop", "scheme"),
            ("https://s3.amazonaws.com/bucket", "scheme"),
            ("S3://bucket", "scheme"),
            ("file:///tmp", "scheme"),
            ("s3://", "bucket"),
            ("s3://ab", "bucket"),
            ("s3://Bucket", "bucket"),
            ("s3://under_score", "bucket"),
            ("s3://-bucket", "bucket"),
            ("s3://bucket-", "bucket"),
            ("s3://a..b", "bucket"),
            ("s3://192.168.1.1", "bucket"),
            ("s3://key:secret@bucket", "bucket"),
            ("s3://bucket:9000/p", "bucket"),
            ("s3://bucket?x=1", "bucket"),
            (long_bucket.as_str(), "bucket"),
            ("s3://bucket//p", "prefix"),
            ("s3://bucket/a//b", "prefix"),
            ("s3://bucket/a/../b", "prefix"),
            ("s3://bucket/./b", "prefix"),
            ("s3://bucket/a b", "prefix"),
            ("s3://bucket/a?b", "prefix"),
            ("s3://bucket/a#b", "prefix"),
            ("s3://bucket/ü", "prefix"),
            (long.as_str(), "prefix"),
        ] {
            let e = url.parse::<S3Location>().unwrap_err();
            assert_eq!(e.field, field, "{url}: {e}");
            assert!(e.to_string().starts_with("artifact-url: "), "{e}");
        }
    }
}
