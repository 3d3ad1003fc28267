//! The `datasets` section: the URI schemes a bridge hands to a job, and
//! the rule each URI follows.

/// Dataset URI schemes the bridge knows how to hand to a job.
pub const DATASET_SCHEMES: &[&str] = &[
    "file",
    "s3",
    "gs",
    "http",
    "https",
    "hf",
    "edgeloop-artifact",
];

pub(super) fn validate_dataset_uri(uri: &str) -> Result<(), String> {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return Err(format!(
            "{uri:?} is not a URI: expected scheme://..., with scheme one of {}",
            DATASET_SCHEMES.join(", ")
        ));
    };
    if !DATASET_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) {
        return Err(format!(
            "scheme {scheme:?} is not supported: use one of {}",
            DATASET_SCHEMES.join(", ")
        ));
    }
    if rest.is_empty() {
        return Err(format!("{uri:?} names no location after the scheme"));
    }
    if uri.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{uri:?} contains whitespace or control characters"));
    }
    if scheme.eq_ignore_ascii_case("edgeloop-artifact") {
        rest.parse::<edgeloop_models::Digest>().map_err(|e| {
            format!("{uri:?}: an edgeloop-artifact URI names a digest (sha256:<64 hex>): {e}")
        })?;
    }
    Ok(())
}
