//! [`JobSpec::validate`]: every rule that types alone do not express, for
//! the top-level fields (name, image, command, environment, working
//! directory, hyperparameters) here and for each section in its file.

use super::dataset::validate_dataset_uri;
use super::{JobSpec, LauncherSpec, SpecError, TORCHRUN_VARS};

impl JobSpec {
    /// Checks every rule that types alone do not express. Returns the first
    /// broken rule, naming its field.
    pub fn validate(&self) -> Result<(), SpecError> {
        if !edgeloop_models::names::is_valid_name(&self.name) {
            return Err(SpecError::invalid(
                "name",
                format!(
                    "{:?} is not a valid name: {}",
                    self.name,
                    edgeloop_models::names::NAME_RULE
                ),
            ));
        }
        if let Some(image) = &self.image {
            crate::images::check_reference(image)
                .map_err(|e| SpecError::invalid("image", e.to_string()))?;
        }
        if self.command.is_empty() {
            return Err(SpecError::invalid(
                "command",
                "must name the program to run",
            ));
        }
        if self.command[0].is_empty() {
            return Err(SpecError::invalid("command[0]", "the program is empty"));
        }
        for (field, list) in [("command", &self.command), ("args", &self.args)] {
            for (i, arg) in list.iter().enumerate() {
                if arg.contains('\0') {
                    return Err(SpecError::invalid(
                        format!("{field}[{i}]"),
                        "contains a NUL byte, which no process argument can hold",
                    ));
                }
            }
        }
        self.validate_env()?;
        if let Some(dir) = &self.working_dir {
            let text = dir.to_string_lossy();
            if text.is_empty() || text.contains('\0') {
                return Err(SpecError::invalid(
                    "working_dir",
                    "must be a non-empty path without NUL bytes",
                ));
            }
        }
        self.validate_resources()?;
        self.validate_launcher()?;
        self.validate_nccl()?;
        for (i, uri) in self.datasets.iter().enumerate() {
            validate_dataset_uri(uri)
                .map_err(|m| SpecError::invalid(format!("datasets[{i}]"), m))?;
        }
        for key in self.hyperparameters.keys() {
            if key.is_empty() {
                return Err(SpecError::invalid(
                    "hyperparameters",
                    "a hyperparameter has an empty name",
                ));
            }
        }
        self.validate_checkpoint()?;
        self.validate_restarts()?;
        Ok(())
    }

    fn validate_env(&self) -> Result<(), SpecError> {
        for (key, value) in &self.env {
            let field = format!("env.{key}");
            if !is_env_name(key) {
                return Err(SpecError::invalid(
                    field,
                    format!("{key:?} is not an environment variable name: use letters, digits and '_', not starting with a digit"),
                ));
            }
            if key.starts_with("EDGELOOP_") {
                return Err(SpecError::invalid(
                    field,
                    "EDGELOOP_* variables are set by the bridge (the checkpoint contract)",
                ));
            }
            if key.starts_with("NCCL_") {
                return Err(SpecError::invalid(
                    field,
                    "NCCL settings go under `nccl`, where they are checked",
                ));
            }
            if !matches!(self.launcher, LauncherSpec::None {})
                && TORCHRUN_VARS.contains(&key.as_str())
            {
                return Err(SpecError::invalid(
                    field,
                    "the launcher sets this variable for each process",
                ));
            }
            if value.contains('\0') {
                return Err(SpecError::invalid(
                    field,
                    "contains a NUL byte, which no environment value can hold",
                ));
            }
        }
        Ok(())
    }
}

/// POSIX portable environment names: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_env_name(key: &str) -> bool {
    let mut bytes = key.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}
