//! This machine's NVIDIA GPUs, as `nvidia-smi` reports them, for the facts
//! agents and bridges send the control plane.
//!
//! `nvidia-smi` rather than linking NVML: it ships with every driver, needs
//! no library at build or load time, and a machine without it simply has no
//! GPUs (not an error). It can hang on a wedged driver, so every call has a
//! deadline. Tests, and machines whose facts are known better than the tool
//! knows them, inject facts from a JSON file instead ([`LocalGpus::load`]).

use std::io::Read as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// One GPU of this machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalGpu {
    /// The index `CUDA_VISIBLE_DEVICES` names it by.
    pub index: u32,
    /// The product, e.g. `NVIDIA H200`.
    pub name: String,
    pub memory_bytes: u64,
}

/// What this machine has. `gpus` is empty on a machine without NVIDIA GPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalGpus {
    #[serde(default)]
    pub gpus: Vec<LocalGpu>,
    #[serde(default)]
    pub driver_version: Option<String>,
    /// The newest CUDA the driver supports (`nvidia-smi`'s "CUDA Version").
    #[serde(default)]
    pub cuda_version: Option<String>,
    /// Where the facts came from: `nvidia-smi`, the Jetson's release
    /// files, or the injected file.
    #[serde(default)]
    pub source: String,
    /// Jetson: the L4T (Jetson Linux) release, e.g. `36.4.3`, which fixes
    /// the GPU driver there (Jetsons have no separate driver version).
    #[serde(default)]
    pub l4t_release: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum GpuFactsError {
    #[error("reading GPU facts from {path}: {message}")]
    Read { path: String, message: String },
    #[error("GPU facts in {path}: {message}")]
    Invalid { path: String, message: String },
}

const NVIDIA_SMI_DEADLINE: Duration = Duration::from_secs(10);
/// More than any chassis holds; a longer list is not a GPU list.
const MAX_GPUS: usize = 64;

impl LocalGpus {
    /// Asks `nvidia-smi`. No tool, a failing tool or unreadable output all
    /// mean "no GPUs"; the reason is in `source` and logged.
    pub fn detect() -> LocalGpus {
        let found = Self::from_nvidia_smi();
        if !found.gpus.is_empty() {
            return found;
        }
        // Jetsons have no discrete GPU for nvidia-smi to list (older
        // releases have no nvidia-smi at all); their release files say.
        jetson(Path::new("/")).unwrap_or(found)
    }

    fn from_nvidia_smi() -> LocalGpus {
        let query = [
            "--query-gpu=index,name,memory.total,driver_version",
            "--format=csv,noheader,nounits",
        ];
        let listed = match run("nvidia-smi", &query) {
            Ok(out) => parse_query(&out),
            Err(why) => {
                tracing::debug!(%why, "no NVIDIA GPUs found");
                return LocalGpus {
                    source: format!("nvidia-smi: {why}"),
                    ..LocalGpus::default()
                };
            }
        };
        match listed {
            Ok((gpus, driver_version)) => LocalGpus {
                gpus,
                driver_version,
                cuda_version: run("nvidia-smi", &[])
                    .ok()
                    .and_then(|s| parse_cuda_version(&s)),
                source: "nvidia-smi".into(),
                l4t_release: None,
            },
            Err(why) => {
                tracing::warn!(%why, "nvidia-smi's answer was not understood; reporting no GPUs");
                LocalGpus {
                    source: format!("nvidia-smi: {why}"),
                    ..LocalGpus::default()
                }
            }
        }
    }

    /// Facts from a JSON file (`{"gpus": [{"index", "name", "memory_bytes"}],
    /// "driver_version", "cuda_version"}`), for tests and for machines where
    /// `nvidia-smi` is not the truth.
    pub fn load(path: &Path) -> Result<LocalGpus, GpuFactsError> {
        let shown = path.display().to_string();
        let raw = std::fs::read_to_string(path).map_err(|e| GpuFactsError::Read {
            path: shown.clone(),
            message: e.to_string(),
        })?;
        let mut facts: LocalGpus =
            serde_json::from_str(&raw).map_err(|e| GpuFactsError::Invalid {
                path: shown.clone(),
                message: e.to_string(),
            })?;
        let invalid = |message: String| GpuFactsError::Invalid {
            path: shown.clone(),
            message,
        };
        if facts.gpus.len() > MAX_GPUS {
            return Err(invalid(format!("more than {MAX_GPUS} GPUs")));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, g) in facts.gpus.iter().enumerate() {
            if !seen.insert(g.index) {
                return Err(invalid(format!(
                    "gpus[{i}].index {} is listed twice",
                    g.index
                )));
            }
        }
        facts.source = format!("file {shown}");
        Ok(facts)
    }
}

/// A Jetson's integrated GPU, from the files under `root` (`/` on the
/// device): `/etc/nv_tegra_release` (the L4T release), the board's name in
/// `/proc/device-tree/model`, CUDA from `/usr/local/cuda/version.json`, and
/// the memory it shares with the CPU from `/proc/meminfo`. `None` on any
/// other machine.
pub fn jetson(root: &Path) -> Option<LocalGpus> {
    let read = |p: &str| std::fs::read(root.join(p)).ok();
    let release = parse_tegra_release(&String::from_utf8_lossy(&read("etc/nv_tegra_release")?))?;
    let model = read("proc/device-tree/model")
        .map(|m| {
            String::from_utf8_lossy(&m)
                .trim_end_matches('\0')
                .trim()
                .to_string()
        })
        .filter(|m| !m.is_empty() && m.len() <= 256)
        .unwrap_or_else(|| "NVIDIA Jetson".into());
    let memory_bytes = read("proc/meminfo")
        .and_then(|m| parse_mem_total(&String::from_utf8_lossy(&m)))
        .unwrap_or(0);
    let cuda_version = read("usr/local/cuda/version.json")
        .and_then(|v| serde_json::from_slice::<serde_json::Value>(&v).ok())
        .and_then(|v| v.pointer("/cuda/version")?.as_str().map(str::to_string))
        .and_then(|v| {
            let mut parts = v.split('.');
            let (major, minor) = (parts.next()?, parts.next()?);
            let short = format!("{major}.{minor}");
            is_version(&short).then_some(short)
        });
    Some(LocalGpus {
        gpus: vec![LocalGpu {
            index: 0,
            name: model,
            memory_bytes,
        }],
        driver_version: None,
        cuda_version,
        source: "jetson: /etc/nv_tegra_release".into(),
        l4t_release: Some(release),
    })
}

/// `# R36 (release), REVISION: 4.3, GCID: ...` → `36.4.3`.
pub fn parse_tegra_release(text: &str) -> Option<String> {
    let line = text.lines().next()?;
    let major: String = line
        .split_once('R')?
        .1
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let revision = line
        .split(',')
        .find_map(|f| f.trim().strip_prefix("REVISION:"))?
        .trim();
    let version = format!("{major}.{revision}");
    is_version(&version).then_some(version)
}

/// `MemTotal:       7801124 kB` → bytes.
fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    kb.checked_mul(1024)
}

/// Runs a tool with a deadline; its stdout, or why not.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    loop {
        match child.try_wait().map_err(|e| e.to_string())? {
            Some(status) if status.success() => break,
            Some(status) => return Err(format!("exited with {status}")),
            None if started.elapsed() > NVIDIA_SMI_DEADLINE => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {NVIDIA_SMI_DEADLINE:?}"));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let mut out = String::new();
    if let Some(stdout) = child.stdout.take() {
        stdout
            .take(1 << 20)
            .read_to_string(&mut out)
            .map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// Parses `index, name, memory.total [MiB], driver_version` lines. Every
/// GPU of one machine runs one driver; the first line's is returned.
pub fn parse_query(out: &str) -> Result<(Vec<LocalGpu>, Option<String>), String> {
    let mut gpus = Vec::new();
    let mut driver = None;
    for (n, line) in out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .enumerate()
    {
        if gpus.len() == MAX_GPUS {
            return Err(format!("more than {MAX_GPUS} GPUs listed"));
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [index, name, memory_mib, driver_version] = fields[..] else {
            return Err(format!(
                "line {}: expected 4 fields, got {}",
                n + 1,
                fields.len()
            ));
        };
        let index: u32 = index
            .parse()
            .map_err(|_| format!("line {}: index {index:?} is not a number", n + 1))?;
        // "[N/A]" on some boards: the memory is then unknown, not zero GPUs.
        let memory_bytes = memory_mib
            .parse::<u64>()
            .map(|m| m.saturating_mul(1 << 20))
            .unwrap_or(0);
        if name.is_empty() || name.len() > 256 {
            return Err(format!("line {}: no usable GPU name", n + 1));
        }
        if driver.is_none() && is_version(driver_version) {
            driver = Some(driver_version.to_string());
        }
        gpus.push(LocalGpu {
            index,
            name: name.to_string(),
            memory_bytes,
        });
    }
    Ok((gpus, driver))
}

/// `CUDA Version: 12.8` from `nvidia-smi`'s banner.
pub fn parse_cuda_version(banner: &str) -> Option<String> {
    let at = banner.find("CUDA Version:")?;
    let rest = banner[at + "CUDA Version:".len()..].trim_start();
    let version: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    is_version(&version).then_some(version)
}

fn is_version(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_answer_is_read() {
        let out = "0, NVIDIA H200, 143771, 570.86.15\n1, NVIDIA H200, 143771, 570.86.15\n";
        let (gpus, driver) = parse_query(out).unwrap();
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[1].index, 1);
        assert_eq!(gpus[0].name, "NVIDIA H200");
        assert_eq!(gpus[0].memory_bytes, 143_771 << 20);
        assert_eq!(driver.as_deref(), Some("570.86.15"));
        let (gpus, driver) = parse_query("0, Orin, [N/A], [N/A]\n").unwrap();
        assert_eq!((gpus[0].memory_bytes, driver), (0, None));
        assert!(parse_query("0, NVIDIA H200\n").is_err());
        assert!(parse_query("zero, NVIDIA H200, 1, 1\n").is_err());
        assert_eq!(parse_query("").unwrap(), (vec![], None));
    }

    #[test]
    fn the_cuda_version_comes_from_the_banner() {
        let banner =
            "| NVIDIA-SMI 570.86.15   Driver Version: 570.86.15   CUDA Version: 12.8     |";
        assert_eq!(parse_cuda_version(banner).as_deref(), Some("12.8"));
        assert_eq!(parse_cuda_version("CUDA Version: N/A"), None);
        assert_eq!(parse_cuda_version("no banner"), None);
    }

    #[test]
    fn injected_facts_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpus.json");
        std::fs::write(
            &path,
            r#"{"gpus": [{"index": 0, "name": "fake", "memory_bytes": 1}, {"index": 0, "name": "fake", "memory_bytes": 1}]}"#,
        )
        .unwrap();
        let err = LocalGpus::load(&path).unwrap_err().to_string();
        assert!(err.contains("gpus[1].index 0 is listed twice"), "{err}");
        std::fs::write(&path, r#"{"gpus": [], "driver": "1"}"#).unwrap();
        assert!(LocalGpus::load(&path)
            .unwrap_err()
            .to_string()
            .contains("driver"));
        std::fs::write(&path, r#"{"gpus": [{"index": 3, "name": "fake", "memory_bytes": 1}], "driver_version": "535.104.05"}"#).unwrap();
        let facts = LocalGpus::load(&path).unwrap();
        assert_eq!(facts.gpus[0].index, 3);
        assert!(facts.source.starts_with("file "), "{}", facts.source);
    }

    #[test]
    fn a_jetson_is_read_from_its_release_files() {
        let root = tempfile::tempdir().unwrap();
        let put = |p: &str, body: &[u8]| {
            let path = root.path().join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, body).unwrap();
        };
        assert!(
            jetson(root.path()).is_none(),
            "not a Jetson without the release file"
        );
        put(
            "etc/nv_tegra_release",
            b"# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8 01:49:37 UTC 2025\n",
        );
        put(
            "proc/device-tree/model",
            b"NVIDIA Jetson AGX Orin Developer Kit\0",
        );
        put(
            "proc/meminfo",
            b"MemTotal:       64335836 kB\nMemFree: 1 kB\n",
        );
        put(
            "usr/local/cuda/version.json",
            br#"{"cuda": {"name": "CUDA SDK", "version": "12.6.68"}}"#,
        );
        let j = jetson(root.path()).unwrap();
        assert_eq!(j.l4t_release.as_deref(), Some("36.4.3"));
        assert_eq!(j.cuda_version.as_deref(), Some("12.6"));
        assert_eq!(j.gpus[0].name, "NVIDIA Jetson AGX Orin Developer Kit");
        assert_eq!(j.gpus[0].memory_bytes, 64_335_836 * 1024);
        assert_eq!(
            parse_tegra_release("# R32 (release), REVISION: 7.1, GCID: 1"),
            Some("32.7.1".into())
        );
        assert_eq!(parse_tegra_release("garbage"), None);
    }

    proptest::proptest! {
        #[test]
        fn parsers_never_panic(s in ".{0,400}") {
            let _ = parse_query(&s);
            let _ = parse_cuda_version(&s);
            let _ = parse_tegra_release(&s);
            let _ = parse_mem_total(&s);
        }

        #[test]
        fn listed_gpus_round_trip(
            gpus in proptest::collection::vec(("[A-Za-z][A-Za-z0-9 -]{0,30}", 0u64..1_000_000), 0..8)
        ) {
            let out: String = gpus
                .iter()
                .enumerate()
                .map(|(i, (name, mib))| format!("{i}, {}, {mib}, 535.104.05\n", name.trim()))
                .collect();
            let (got, _) = parse_query(&out).unwrap();
            proptest::prop_assert_eq!(got.len(), gpus.len());
            for (g, (name, mib)) in got.iter().zip(&gpus) {
                proptest::prop_assert_eq!(&g.name, name.trim());
                proptest::prop_assert_eq!(g.memory_bytes, mib << 20);
            }
        }
    }
}
