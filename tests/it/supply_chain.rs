//! The fetch scripts' pin check (`scripts/lib/pins.sh`): a file whose
//! sha256 is not the one `scripts/pins.sha256` names for it is refused,
//! and so is a file it does not name at all. Run on a copy of the script
//! beside a pins file written here, so each case is known; and the real
//! pins file is held to its format.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn sha256(bytes: &[u8]) -> String {
    edgeloop_models::Digest::of(bytes)
        .to_string()
        .trim_start_matches("sha256:")
        .to_string()
}

/// `scripts/lib/pins.sh` copied under `root`, with `pins` as its pins file.
fn scripts_with(root: &Path, pins: &str) {
    std::fs::create_dir_all(root.join("scripts/lib")).unwrap();
    std::fs::copy(
        repo().join("scripts/lib/pins.sh"),
        root.join("scripts/lib/pins.sh"),
    )
    .unwrap();
    std::fs::write(root.join("scripts/pins.sha256"), pins).unwrap();
}

/// Sources the copy and runs `call`; its exit status and stderr.
fn run(root: &Path, call: &str) -> (bool, String) {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(". scripts/lib/pins.sh && {call}"))
        .current_dir(root)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_tampered_or_unpinned_file_is_refused_and_a_pinned_one_passes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let good = b"the bytes that were checked\n";
    let files = root.join("downloads");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::write(files.join("lib.so"), good).unwrap();
    std::fs::write(files.join("wheel.whl"), good).unwrap();
    std::fs::write(files.join("stray.tgz"), good).unwrap();
    scripts_with(
        root,
        &format!(
            "# a comment naming a file is no pin:\n# {h}  stray.tgz\n{h}  lib.so\n{h}  wheel.whl\n{h}  installed-name.so\n",
            h = sha256(good)
        ),
    );

    let (ok, err) = run(root, "verify_pinned downloads/lib.so downloads/wheel.whl");
    assert!(ok, "pinned files pass: {err}");
    let (ok, err) = run(root, "verify_pinned_as installed-name.so downloads/lib.so");
    assert!(
        ok,
        "a file pinned under another name passes by that name: {err}"
    );

    // One byte changed: refused, naming the file, the hash and the pin.
    let mut tampered = good.to_vec();
    tampered[0] ^= 1;
    std::fs::write(files.join("lib.so"), &tampered).unwrap();
    let (ok, err) = run(root, "verify_pinned downloads/wheel.whl downloads/lib.so");
    assert!(!ok, "a tampered file passed");
    assert!(
        err.contains("lib.so") && err.contains(&sha256(&tampered)) && err.contains("refusing"),
        "{err}"
    );
    let (ok, _) = run(root, "verify_pinned_as installed-name.so downloads/lib.so");
    assert!(!ok, "a tampered installed file passed");

    // Not pinned (a comment does not count): refused.
    let (ok, err) = run(root, "verify_pinned downloads/stray.tgz");
    assert!(!ok, "an unpinned file passed");
    assert!(err.contains("stray.tgz has no pinned sha256"), "{err}");

    // A missing file is no pass either.
    let (ok, _) = run(root, "verify_pinned downloads/absent.whl");
    assert!(!ok);
}

#[test]
fn the_pins_file_has_one_well_formed_line_per_name() {
    let text = std::fs::read_to_string(repo().join("scripts/pins.sha256")).unwrap();
    let mut names = BTreeSet::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let (hash, name) = line.split_once("  ").unwrap_or_else(|| panic!("{line:?}"));
        assert!(
            hash.len() == 64
                && hash
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
            "{line:?}: a lowercase sha256"
        );
        assert!(
            !name.is_empty() && !name.contains(char::is_whitespace),
            "{line:?}: one file name"
        );
        assert!(names.insert(name.to_string()), "{name} is pinned twice");
    }
    assert!(names.len() >= 5, "{names:?}");
}
