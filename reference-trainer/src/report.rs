//! Progress reports: one JSON line on stdout per report, and a POST to
//! `EDGELOOP_REPORT_URL` when it is set.
//!
//! The POST is plain HTTP/1.1 over a `TcpStream`, not an HTTP client crate:
//! the bridge's endpoint is always `http://127.0.0.1:<port>/...`, so a
//! client would only bring TLS stacks and an async runtime into a trainer
//! that needs neither. A report that cannot be delivered is logged and
//! dropped: progress is advisory, and the checkpoint carries the same
//! metrics anyway.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long one POST may take, end to end per phase.
const TIMEOUT: Duration = Duration::from_secs(2);

/// The body the bridge accepts: `{"step": N, "metrics": {...}}` and nothing
/// else (it refuses unknown fields).
pub fn body(step: u64, metrics: &BTreeMap<String, f64>) -> String {
    // By hand rather than json!(): the key order is then fixed ("step"
    // first) whatever serde_json features the workspace unifies.
    let metrics = serde_json::to_string(metrics).unwrap_or_else(|_| "{}".into());
    format!("{{\"step\":{step},\"metrics\":{metrics}}}")
}

#[derive(Debug, thiserror::Error)]
pub enum PostError {
    #[error("{0:?} is not an http:// URL (the trainer speaks plain HTTP only)")]
    Scheme(String),
    #[error("{0:?} names no host")]
    NoHost(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the server answered {0:?}")]
    Status(String),
}

/// POSTs `body` as JSON to `url` (`http://host[:port][/path]`) and waits for
/// a 2xx status line.
pub fn post_json(url: &str, body: &str) -> Result<(), PostError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| PostError::Scheme(url.to_string()))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return Err(PostError::NoHost(url.to_string()));
    }
    let with_port = if authority.rsplit(':').next().is_some_and(|p| {
        !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && authority.contains(':')
    }) {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let addr = with_port
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| PostError::NoHost(url.to_string()))?;
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes())?;
    // Only the status line matters; read until it is complete.
    let mut head = Vec::new();
    let mut buf = [0u8; 512];
    while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 8192 {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    let status_line = text.lines().next().unwrap_or_default().to_string();
    let code = status_line.split_whitespace().nth(1).unwrap_or_default();
    if status_line.starts_with("HTTP/1.") && code.len() == 3 && code.starts_with('2') {
        Ok(())
    } else {
        Err(PostError::Status(status_line))
    }
}

/// Writes the report line to `out` and POSTs it to `url` when given.
pub fn report(
    out: &mut dyn Write,
    url: Option<&str>,
    step: u64,
    metrics: &BTreeMap<String, f64>,
) -> std::io::Result<()> {
    let line = body(step, metrics);
    writeln!(out, "{line}")?;
    out.flush()?;
    if let Some(url) = url {
        if let Err(e) = post_json(url, &line) {
            eprintln!("edgeloop-train: progress report for step {step} to {url} failed: {e}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A one-request server: returns the request it read, answers `status`.
    fn serve_once(status: &'static str) -> (String, std::thread::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!(
            "http://{}/v1/jobs/j1/progress",
            listener.local_addr().unwrap()
        );
        let handle = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            // Read the head, then as many body bytes as Content-Length says.
            loop {
                let n = s.read(&mut buf).unwrap();
                req.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&req).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let len: usize = text
                        .lines()
                        .find_map(|l| l.strip_prefix("Content-Length: "))
                        .unwrap()
                        .parse()
                        .unwrap();
                    if req.len() >= end + 4 + len || n == 0 {
                        break;
                    }
                }
            }
            s.write_all(format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n").as_bytes())
                .unwrap();
            String::from_utf8(req).unwrap()
        });
        (url, handle)
    }

    #[test]
    fn posts_the_report_as_json() {
        let (url, server) = serve_once("200 OK");
        let metrics = BTreeMap::from([("loss".to_string(), 0.5), ("accuracy".to_string(), 0.75)]);
        let mut out = Vec::new();
        report(&mut out, Some(&url), 12, &metrics).unwrap();
        let req = server.join().unwrap();
        assert!(
            req.starts_with("POST /v1/jobs/j1/progress HTTP/1.1\r\n"),
            "{req}"
        );
        assert!(req.contains("Content-Type: application/json\r\n"), "{req}");
        let body = req.split("\r\n\r\n").nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"step": 12, "metrics": {"loss": 0.5, "accuracy": 0.75}})
        );
        assert_eq!(String::from_utf8(out).unwrap(), format!("{body}\n"));
    }

    #[test]
    fn failures_are_errors_not_panics() {
        let (url, server) = serve_once("422 Unprocessable Entity");
        let e = post_json(&url, "{}").unwrap_err();
        assert!(e.to_string().contains("422"), "{e}");
        server.join().unwrap();
        assert!(matches!(
            post_json("https://127.0.0.1:1/x", "{}"),
            Err(PostError::Scheme(_))
        ));
        assert!(matches!(
            post_json("http:///x", "{}"),
            Err(PostError::NoHost(_))
        ));
        // Nothing listens there: a connection error, and report() carries on.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = format!("http://{}/p", listener.local_addr().unwrap());
        drop(listener);
        assert!(post_json(&dead, "{}").is_err());
        let mut out = Vec::new();
        report(&mut out, Some(&dead), 1, &BTreeMap::new()).unwrap();
        assert_eq!(out, b"{\"step\":1,\"metrics\":{}}\n");
    }
}
