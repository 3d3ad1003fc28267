//! What `model push` and `model pull` share: progress bars for large files
//! (drawn only on a terminal, never with `--json`), hashing a file as it
//! streams past, and local files as typed failures.

use std::io::Read as _;
use std::path::Path;

use edgeloop_models::{Digest, Sha256Writer};
use indicatif::{ProgressBar, ProgressStyle};

use super::api::CliError;

/// A byte-counting bar labelled `label` for `total` bytes (a spinner when
/// the total is unknown); hidden with `--json`. indicatif draws on stderr
/// only when it is a terminal.
pub fn bar(label: &str, total: Option<u64>, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = match total {
        Some(n) => ProgressBar::new(n).with_style(
            ProgressStyle::with_template(
                "{msg:14} {bar:32} {bytes:>10}/{total_bytes:<10} {bytes_per_sec:>12} {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{msg:14} {spinner} {bytes:>10} {bytes_per_sec:>12}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        ),
    };
    bar.set_message(label.to_string());
    bar
}

/// A file that cannot be read: 66 when it is not there, 74 otherwise.
pub fn unreadable(path: &Path, e: std::io::Error) -> CliError {
    let message = format!("{}: {e}", path.display());
    if e.kind() == std::io::ErrorKind::NotFound {
        CliError::NotFound(message)
    } else {
        CliError::Io(message)
    }
}

/// The sha256 and size of the file at `path`, read in chunks (never whole
/// in memory), with a bar labelled `label`.
pub fn hash_file(path: &Path, label: &str, quiet: bool) -> Result<(Digest, u64), CliError> {
    let mut file = std::fs::File::open(path).map_err(|e| unreadable(path, e))?;
    let size = file.metadata().map_err(|e| unreadable(path, e))?.len();
    let bar = bar(label, Some(size), quiet);
    let mut hash = Sha256Writer::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| unreadable(path, e))?;
        if n == 0 {
            break;
        }
        // `n` is at most the buffer's length.
        hash.update(buf.get(..n).unwrap_or_default());
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    let read = hash.len();
    if read != size {
        return Err(CliError::Io(format!(
            "{} changed while it was read ({size} bytes, then {read})",
            path.display()
        )));
    }
    Ok((hash.finish(), size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_hashes_as_its_bytes_do() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &bytes).unwrap();
        assert_eq!(
            hash_file(&p, "f", true).unwrap(),
            (Digest::of(&bytes), bytes.len() as u64)
        );
        let missing = hash_file(&dir.path().join("nope"), "f", true).unwrap_err();
        assert_eq!(missing.exit_code(), std::process::ExitCode::from(66));
    }
}
