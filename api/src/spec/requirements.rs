//! The `requirements` section's entries: the software a job needs
//! (`torch>=2.0`, `cuda>=11.8`, `tensorflow~=2.15`), which the bridge's
//! pre-flight check holds against what a cluster has.

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Serialize};

/// A software the job needs, as `torch>=2.0`, `cuda>=11.8`,
/// `tensorflow~=2.15`. Serialized as that string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Requirement {
    pub framework: Framework,
    pub op: VersionOp,
    pub version: Version,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Framework {
    Torch,
    TensorFlow,
    Cuda,
}

impl Framework {
    pub fn as_str(self) -> &'static str {
        match self {
            Framework::Torch => "torch",
            Framework::TensorFlow => "tensorflow",
            Framework::Cuda => "cuda",
        }
    }

    fn parse(name: &str) -> Option<Framework> {
        match name.to_ascii_lowercase().as_str() {
            "torch" | "pytorch" => Some(Framework::Torch),
            "tensorflow" | "tensorflow-gpu" => Some(Framework::TensorFlow),
            "cuda" => Some(Framework::Cuda),
            _ => None,
        }
    }
}

/// PEP 440's comparison operators, minus `!=` and `===` (an exclusion never
/// makes a job impossible, so the pre-flight check has no use for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionOp {
    Ge,
    Eq,
    Le,
    Gt,
    Lt,
    /// Compatible release: `~=2.1` is `>=2.1, ==2.*`; `~=2.1.3` is
    /// `>=2.1.3, ==2.1.*`.
    Compatible,
}

impl VersionOp {
    pub fn as_str(self) -> &'static str {
        match self {
            VersionOp::Ge => ">=",
            VersionOp::Eq => "==",
            VersionOp::Le => "<=",
            VersionOp::Gt => ">",
            VersionOp::Lt => "<",
            VersionOp::Compatible => "~=",
        }
    }
}

/// A numeric dotted version (`12.2`, `535.104.05`). Missing components
/// compare as zero, so `2.0 == 2.0.0`.
#[derive(Debug, Clone, Eq)]
pub struct Version(pub Vec<u32>);

impl Version {
    /// Up to 4 dot-separated decimal components; leading zeros are allowed
    /// because driver versions have them (`535.104.05`).
    pub fn parse(text: &str) -> Option<Version> {
        let parts = text
            .split('.')
            .map(|p| {
                if p.is_empty() || p.len() > 9 || !p.bytes().all(|b| b.is_ascii_digit()) {
                    None
                } else {
                    p.parse::<u32>().ok()
                }
            })
            .collect::<Option<Vec<u32>>>()?;
        if parts.is_empty() || parts.len() > 4 {
            return None;
        }
        Some(Version(parts))
    }

    pub fn major(&self) -> u32 {
        self.0.first().copied().unwrap_or(0)
    }

    pub fn minor(&self) -> u32 {
        self.0.get(1).copied().unwrap_or(0)
    }

    /// The first `n` components (padded with zeros).
    pub fn truncate(&self, n: usize) -> Version {
        Version(
            (0..n)
                .map(|i| self.0.get(i).copied().unwrap_or(0))
                .collect(),
        )
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        let len = self.0.len().max(other.0.len());
        for i in 0..len {
            let a = self.0.get(i).copied().unwrap_or(0);
            let b = other.0.get(i).copied().unwrap_or(0);
            match a.cmp(&b) {
                Ordering::Equal => {}
                unequal => return unequal,
            }
        }
        Ordering::Equal
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, part) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            write!(f, "{part}")?;
        }
        Ok(())
    }
}

impl Requirement {
    /// Whether `candidate` satisfies this requirement.
    pub fn matches(&self, candidate: &Version) -> bool {
        let v = &self.version;
        match self.op {
            VersionOp::Ge => candidate >= v,
            VersionOp::Eq => candidate == v,
            VersionOp::Le => candidate <= v,
            VersionOp::Gt => candidate > v,
            VersionOp::Lt => candidate < v,
            VersionOp::Compatible => {
                // Parsing guarantees at least two components.
                let prefix = v.0.len().saturating_sub(1);
                candidate >= v && candidate.truncate(prefix) == v.truncate(prefix)
            }
        }
    }

    pub fn parse(text: &str) -> Result<Requirement, String> {
        let trimmed = text.trim();
        let name_end = trimmed
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(trimmed.len());
        let (name, rest) = trimmed.split_at(name_end);
        if name.is_empty() {
            return Err(format!(
                "{text:?} names no framework: write e.g. torch>=2.0, cuda>=11.8, tensorflow>=2.13"
            ));
        }
        let framework = Framework::parse(name).ok_or_else(|| {
            format!("{text:?}: unknown framework {name:?} (known: torch, tensorflow, cuda)")
        })?;
        let rest = rest.trim_start();
        let ops = [
            (">=", VersionOp::Ge),
            ("==", VersionOp::Eq),
            ("<=", VersionOp::Le),
            ("~=", VersionOp::Compatible),
            (">", VersionOp::Gt),
            ("<", VersionOp::Lt),
        ];
        let (op, version_text) = ops
            .iter()
            .find_map(|(s, op)| rest.strip_prefix(s).map(|r| (*op, r.trim())))
            .ok_or_else(|| {
                format!("{text:?}: expected one of >=, ==, <=, >, <, ~= after {name:?}")
            })?;
        let version = Version::parse(version_text).ok_or_else(|| {
            format!("{text:?}: {version_text:?} is not a version (numbers separated by dots)")
        })?;
        if op == VersionOp::Compatible && version.0.len() < 2 {
            return Err(format!(
                "{text:?}: ~= needs at least two version components, e.g. ~=2.1"
            ));
        }
        Ok(Requirement {
            framework,
            op,
            version,
        })
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{}{}",
            self.framework.as_str(),
            self.op.as_str(),
            self.version
        )
    }
}

impl TryFrom<String> for Requirement {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        Requirement::parse(&text)
    }
}

impl From<Requirement> for String {
    fn from(r: Requirement) -> String {
        r.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_with_missing_components_as_zero() {
        let v = |s: &str| Version::parse(s).unwrap();
        assert_eq!(v("2.0"), v("2.0.0"));
        assert!(v("535.104.05") > v("535.54.03"));
        assert!(v("11.10") > v("11.8"));
        assert_eq!(v("535.104.05").to_string(), "535.104.5");
        assert!(Version::parse("1.x").is_none());
        assert!(Version::parse("").is_none());
        assert!(Version::parse("1..2").is_none());
        assert!(Version::parse("1.2.3.4.5").is_none());
    }
}
