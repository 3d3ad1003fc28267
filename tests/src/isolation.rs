//! For the few tests that cannot share the test process with whatever
//! else runs: the integration tests are one binary (`tests/it/`), its
//! tests side by side on the test threads.

/// Names the test that a child process runs for [`in_own_process`].
const OWN_PROCESS_VAR: &str = "EDGELOOP_TEST_OWN_PROCESS";

/// The test this thread runs (libtest names each test's thread after it).
fn current_test() -> String {
    std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .expect("called from a test's own thread")
        .to_string()
}

/// Whether the calling test goes on here: `true` in a child process of
/// this test binary that runs this test alone; `false` in the test
/// process, once that child has run it and passed (its output, indented,
/// is this test's). For a test that changes what the whole process shares,
/// such as its environment (which every bridge started in the process
/// reads: [`set_env`]) or its peak memory (which it measures):
///
/// ```text
/// if !edgeloop_tests::in_own_process() {
///     return;
/// }
/// ```
///
/// # Panics
/// When the child fails (the test failing), or cannot be run.
pub fn in_own_process() -> bool {
    let test = current_test();
    if std::env::var(OWN_PROCESS_VAR).is_ok_and(|t| t == test) {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(OWN_PROCESS_VAR, &test)
        .output()
        .expect("running the test in a process of its own");
    // Indented: the child's own `test result:` line must not read as one
    // of this run's (scripts/test.sh adds those up).
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in stdout.lines() {
        println!("    | {line}");
    }
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        eprintln!("    | {line}");
    }
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{test} in a process of its own: {} (its output is above)",
        out.status
    );
    false
}

/// `std::env::set_var`, for a test in a process of its own
/// ([`in_own_process`]): anywhere else it would reach the tests beside it.
///
/// # Panics
/// Outside such a process.
pub fn set_env(key: &str, value: impl AsRef<std::ffi::OsStr>) {
    let test = current_test();
    assert!(
        std::env::var(OWN_PROCESS_VAR).is_ok_and(|t| t == test),
        "{test} sets {key} for the whole process: start it with `if !edgeloop_tests::in_own_process() {{ return; }}`"
    );
    std::env::set_var(key, value);
}
