//! The control plane as a list of endpoints (issue #17): a member given
//! several replicas' URLs (`--control-plane https://a:7443,https://b:7443`)
//! enrolls through whichever answers and moves its calls to the next one
//! when a connection to the current one fails. One URL, or one DNS name
//! that resolves to the replicas, is the same list of one.

/// The endpoints in `list`: comma-separated `https://` URLs, in the order
/// given (the first is tried first), each once.
pub fn parse(list: &str) -> Result<Vec<String>, EndpointsError> {
    let mut out: Vec<String> = Vec::new();
    for url in list.split(',').map(str::trim) {
        if url.is_empty() {
            return Err(EndpointsError::Empty);
        }
        if !url.starts_with("https://") || url.len() == "https://".len() {
            return Err(EndpointsError::NotHttps(url.to_string()));
        }
        if !out.iter().any(|u| u == url) {
            out.push(url.to_string());
        }
    }
    Ok(out)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointsError {
    #[error("--control-plane has an empty entry (a stray comma?)")]
    Empty,
    #[error("--control-plane entries must be https:// URLs (gRPC over TLS), got {0:?}")]
    NotHttps(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_in_order_once_each_and_bad_entries_are_named() {
        assert_eq!(parse("https://a:1").unwrap(), ["https://a:1"]);
        assert_eq!(
            parse(" https://a:1 , https://b:2,https://a:1").unwrap(),
            ["https://a:1", "https://b:2"]
        );
        assert_eq!(parse("https://a:1,"), Err(EndpointsError::Empty));
        assert_eq!(parse(""), Err(EndpointsError::Empty));
        assert_eq!(
            parse("https://a:1,http://b:2"),
            Err(EndpointsError::NotHttps("http://b:2".into()))
        );
        assert_eq!(
            parse("https://"),
            Err(EndpointsError::NotHttps("https://".into()))
        );
    }
}
