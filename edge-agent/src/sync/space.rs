//! Free disk space, checked before a download starts, so that a version too
//! large for the device fails at once with a clear reason instead of filling
//! the disk the serving version and the telemetry buffer live on.

use std::path::Path;

use super::failure::Failure;

/// Bytes available to this (unprivileged) process on the file system of `dir`.
// statvfs counts are 32-bit on some edge targets, so the conversions stay.
#[allow(clippy::useless_conversion)]
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let s = nix::sys::statvfs::statvfs(dir).map_err(std::io::Error::from)?;
    Ok(u64::from(s.blocks_available()).saturating_mul(u64::from(s.fragment_size())))
}

/// `Err(NoSpace)` unless `needed` bytes fit in `dir`.
pub fn ensure_space(dir: &Path, needed: u64) -> Result<(), Failure> {
    let free = free_bytes(dir).map_err(|e| Failure::storage("checking free space", e))?;
    if needed > free {
        return Err(Failure::NoSpace {
            dir: dir.display().to_string(),
            needed,
            free,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_cannot_fit() {
        let dir = tempfile::tempdir().unwrap();
        ensure_space(dir.path(), 1).unwrap();
        let err = ensure_space(dir.path(), u64::MAX).unwrap_err();
        assert!(err.to_string().starts_with("no space:"), "{err}");
    }
}
