//! The demo's processes: each a real binary of this workspace, started
//! with its output in a log file, and stopped with SIGTERM (then SIGKILL
//! after a grace period) when the demo ends, however it ends.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

pub struct Procs {
    children: Vec<(String, Child, PathBuf)>,
}

impl Procs {
    pub fn new() -> Procs {
        Procs { children: vec![] }
    }

    /// Starts `bin` with `args`; stdout and stderr go to `<logs>/<name>.log`.
    pub fn spawn(
        &mut self,
        name: &str,
        bin: &Path,
        args: &[String],
        logs: &Path,
    ) -> anyhow::Result<()> {
        let log = logs.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let child = Command::new(bin)
            .args(args)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        self.children.push((name.to_string(), child, log));
        Ok(())
    }

    /// Fails with the log's first error and its tail if any process has
    /// exited.
    pub fn check(&mut self) -> anyhow::Result<()> {
        for (name, child, log) in &mut self.children {
            if let Some(status) = child.try_wait()? {
                let text = std::fs::read_to_string(&*log).unwrap_or_default();
                anyhow::bail!(
                    "{name} exited ({status}); from {}:\n{}",
                    log.display(),
                    log_excerpt(&text)
                );
            }
        }
        Ok(())
    }

    /// SIGTERM to all, newest first; SIGKILL whatever outlives the grace.
    pub fn stop(&mut self) {
        for (_, child, _) in self.children.iter().rev() {
            if let Ok(pid) = i32::try_from(child.id()) {
                // SIGTERM: the processes' one shutdown path (they drain and flush).
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for (_, child, _) in self.children.iter_mut().rev() {
            while Instant::now() < deadline {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        self.children.clear();
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A free loopback port (bound, read, released).
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Lines of a backtrace: `  12: frame` and `             at src/x.rs:1:2`.
fn is_backtrace_frame(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("at ")
        || t.split_once(':')
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// What a failed process's log says about why: its first error line (a
/// panic, an `Error:` from `main`, an `ERROR` event) with the lines after
/// it, then the log's last lines, backtrace frames left out of both. A
/// tail alone can be nothing but frames, which hides the message itself.
fn log_excerpt(text: &str) -> String {
    const FIRST: usize = 6;
    const TAIL: usize = 15;
    let lines: Vec<&str> = text.lines().filter(|l| !is_backtrace_frame(l)).collect();
    let first_error = lines.iter().position(|l| {
        l.contains("panicked at") || l.starts_with("Error:") || l.contains(" ERROR ")
    });
    let tail_from = lines.len().saturating_sub(TAIL);
    let mut out: Vec<&str> = Vec::new();
    if let Some(i) = first_error.filter(|&i| i < tail_from) {
        let end = (i + FIRST).min(tail_from);
        out.extend(&lines[i..end]);
        if end < tail_from {
            out.push("…");
        }
    }
    out.extend(&lines[tail_from..]);
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_excerpt_keeps_the_error_that_a_backtrace_pushed_out_of_the_tail() {
        let mut log = String::from(
            "INFO starting\nError: enrolling: the token has expired\n\nStack backtrace:\n",
        );
        for n in 0..40 {
            log.push_str(&format!(
                "  {n}: edgeloop_agent::frame{n}\n             at src/lib.rs:{n}:5\n"
            ));
        }
        let excerpt = log_excerpt(&log);
        assert!(
            excerpt.contains("Error: enrolling: the token has expired"),
            "{excerpt}"
        );
        assert!(!excerpt.contains("frame"), "{excerpt}");
    }

    #[test]
    fn a_short_log_is_shown_whole_and_once() {
        let log = "INFO up\nthread 'main' panicked at src/main.rs:3:1:\nboom\n";
        assert_eq!(
            log_excerpt(log),
            "INFO up\nthread 'main' panicked at src/main.rs:3:1:\nboom"
        );
    }

    #[test]
    fn a_long_log_gives_the_first_error_a_gap_then_the_tail() {
        let mut log = String::from("2026 ERROR edgeloop: the slot is corrupt\n");
        for n in 0..30 {
            log.push_str(&format!("INFO line {n}\n"));
        }
        let excerpt = log_excerpt(&log);
        let lines: Vec<&str> = excerpt.lines().collect();
        assert_eq!(lines[0], "2026 ERROR edgeloop: the slot is corrupt");
        assert_eq!(lines[6], "…");
        assert_eq!(lines.last(), Some(&"INFO line 29"));
        assert_eq!(lines.len(), 6 + 1 + 15);
    }
}
