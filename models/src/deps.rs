//! Where downloaded dependencies live (ONNX Runtime, test data): the
//! directory named by `EDGELOOP_DEPS`, else `$HOME/.edgeloop/deps`. The
//! fetch scripts in `scripts/` install there, and the library and tests
//! look there, so the two never disagree.

use std::path::PathBuf;

pub const DEPS_DIR_ENV: &str = "EDGELOOP_DEPS";

/// The dependency directory, or None when neither variable is set.
pub fn dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    var(DEPS_DIR_ENV)
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".edgeloop").join("deps")))
}
