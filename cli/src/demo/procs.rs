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

    /// Fails with the log's tail if any process has exited.
    pub fn check(&mut self) -> anyhow::Result<()> {
        for (name, child, log) in &mut self.children {
            if let Some(status) = child.try_wait()? {
                let text = std::fs::read_to_string(&*log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                anyhow::bail!(
                    "{name} exited ({status}); the end of {}:\n{}",
                    log.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
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
