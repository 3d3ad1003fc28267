//! Model aliases (`production`, `staging`): a name per model that points at
//! one of its versions and moves. One record per alias holds where it
//! points and every move (who, when, from, to, why), so a move and its
//! history entry are one atomic write; a deleted alias keeps its record,
//! pointing nowhere, so its history survives.
//!
//! An alias never shares a name with a version of its model (each side is
//! refused with 409 when the other exists), and its name cannot be a
//! numbered or `v<digit>` version ([`AliasName`]): where either may be
//! given, a name resolves as a version first, and never means both.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::Trees;
use crate::models::{self, version_key};
pub use edgeloop_api::aliases::{AliasChange, AliasName, SetAlias};
use edgeloop_errors::validate;
use edgeloop_errors::{Error, Result};

/// Moves kept per alias; older ones are dropped first. Enough for years of
/// promotions, and it bounds the record that each move rewrites.
pub const MAX_HISTORY: usize = 500;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AliasRecord {
    pub model: String,
    pub alias: AliasName,
    /// `None` once deleted.
    #[serde(default)]
    pub version: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    pub updated_by: String,
    /// Oldest first, at most [`MAX_HISTORY`].
    #[serde(default)]
    pub history: Vec<AliasChange>,
}

/// What a `set` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetOutcome {
    Created,
    Moved,
    /// It already pointed there: nothing was written.
    Unchanged,
}

pub fn key(model: &str, alias: &AliasName) -> String {
    // '/' cannot occur in a model name, so prefixes never collide.
    format!("{model}/{alias}")
}

/// Whether `name` is an alias of `model` that points at a version now.
/// A name that is not a valid alias never is.
pub fn points_somewhere(store: &Trees, model: &str, name: &str) -> Result<bool> {
    let Ok(alias) = AliasName::new(name) else {
        return Ok(false);
    };
    Ok(resolve(store, model, &alias)?.is_some())
}

/// The version `alias` points at, if it exists and points anywhere.
pub fn resolve(store: &Trees, model: &str, alias: &AliasName) -> Result<Option<String>> {
    Ok(store
        .model_aliases
        .get(&key(model, alias))?
        .and_then(|r| r.version))
}

/// The alias and its history; 404 if it never existed (a deleted one is
/// found, pointing nowhere).
pub fn get(store: &Trees, model: &str, alias: &AliasName) -> Result<AliasRecord> {
    models::get_model(store, model)?;
    store
        .model_aliases
        .get(&key(model, alias))?
        .ok_or_else(|| Error::not_found("alias", format!("{model}@{alias}")))
}

/// The alias as it points now; 404 if it does not exist or was deleted.
pub fn get_current(store: &Trees, model: &str, alias: &AliasName) -> Result<AliasRecord> {
    let record = get(store, model, alias)?;
    if record.version.is_none() {
        return Err(Error::not_found("alias", format!("{model}@{alias}")));
    }
    Ok(record)
}

/// The model's aliases that point somewhere, by name.
pub fn list(store: &Trees, model: &str) -> Result<Vec<AliasRecord>> {
    models::get_model(store, model)?;
    Ok(store
        .model_aliases
        .scan_prefix(&format!("{model}/"))?
        .into_iter()
        .map(|(_, r)| r)
        .filter(|r| r.version.is_some())
        .collect())
}

fn check_reason(reason: &Option<String>) -> Result<()> {
    if let Some(r) = reason {
        validate::text("reason", r, 512)?;
        if r.chars().any(char::is_control) {
            return Err(Error::bad_field(
                "reason",
                "must not contain control characters",
            ));
        }
    }
    Ok(())
}

/// Appends `change`, dropping the oldest entries beyond [`MAX_HISTORY`].
fn push_history(history: &mut Vec<AliasChange>, change: AliasChange) {
    history.push(change);
    if history.len() > MAX_HISTORY {
        let excess = history.len() - MAX_HISTORY;
        history.drain(..excess);
    }
}

/// Points `alias` at `req.version` (an existing version of `model`),
/// creating or moving it, and records the move; `by` is the caller.
pub async fn set(
    store: &Trees,
    model: &str,
    alias: &AliasName,
    req: SetAlias,
    by: &str,
    now: OffsetDateTime,
) -> Result<(AliasRecord, SetOutcome)> {
    models::get_model(store, model)?;
    validate::version("version", &req.version)?;
    check_reason(&req.reason)?;
    models::get_version(store, model, &req.version)?;
    if store
        .model_versions
        .contains(&version_key(model, alias.as_str()))?
    {
        return Err(Error::Conflict(format!(
            "model {model:?} has a version {alias:?}; an alias may not have a version's name"
        )));
    }
    let mut outcome = SetOutcome::Unchanged;
    let record = store.model_aliases.update(&key(model, alias), |cur| {
        let change = |from: Option<String>| AliasChange {
            at: now,
            by: by.to_string(),
            from,
            to: Some(req.version.clone()),
            reason: req.reason.clone(),
        };
        Ok::<_, Error>(match cur {
            Some(cur) if cur.version.as_deref() == Some(req.version.as_str()) => {
                outcome = SetOutcome::Unchanged;
                cur
            }
            Some(mut cur) => {
                outcome = if cur.version.is_some() {
                    SetOutcome::Moved
                } else {
                    SetOutcome::Created
                };
                push_history(&mut cur.history, change(cur.version.clone()));
                cur.version = Some(req.version.clone());
                cur.updated_at = now;
                cur.updated_by = by.to_string();
                cur
            }
            None => {
                outcome = SetOutcome::Created;
                AliasRecord {
                    model: model.to_string(),
                    alias: alias.clone(),
                    version: Some(req.version.clone()),
                    updated_at: now,
                    updated_by: by.to_string(),
                    history: vec![change(None)],
                }
            }
        })
    })??;
    if outcome != SetOutcome::Unchanged {
        store.flush().await?;
    }
    Ok((record, outcome))
}

/// Deletes `alias` (it points nowhere from now on); its history is kept,
/// with the deletion as its last entry. 404 if it points nowhere already.
pub async fn delete(
    store: &Trees,
    model: &str,
    alias: &AliasName,
    by: &str,
    now: OffsetDateTime,
) -> Result<AliasRecord> {
    models::get_model(store, model)?;
    let missing = || Error::not_found("alias", format!("{model}@{alias}"));
    let record = store.model_aliases.update(&key(model, alias), |cur| {
        let mut cur = cur.ok_or_else(missing)?;
        let Some(from) = cur.version.take() else {
            return Err(missing());
        };
        push_history(
            &mut cur.history,
            AliasChange {
                at: now,
                by: by.to_string(),
                from: Some(from),
                to: None,
                reason: None,
            },
        );
        cur.updated_at = now;
        cur.updated_by = by.to_string();
        Ok(cur)
    })??;
    store.flush().await?;
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::{CreateModel, ModelVersionRecord};

    fn t(s: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000 + s).unwrap()
    }

    fn alias(s: &str) -> AliasName {
        AliasName::new(s).unwrap()
    }

    fn to(version: &str) -> SetAlias {
        SetAlias {
            version: version.into(),
            reason: None,
        }
    }

    /// A store with model `digits` and versions `1`, `2` (records written
    /// directly: their artifacts do not matter here).
    async fn store(dir: &std::path::Path) -> Trees {
        let store = Trees::open(&edgeloop_store::Store::open(&dir.join("db")).unwrap()).unwrap();
        models::create_model(
            &store,
            CreateModel {
                name: "digits".into(),
                ..Default::default()
            },
            t(0),
        )
        .await
        .unwrap();
        for v in ["1", "2"] {
            let record = ModelVersionRecord {
                model: "digits".into(),
                version: v.into(),
                artifact_digest: edgeloop_models::Digest::of(v.as_bytes()),
                artifact_size: 1,
                format: crate::models::ArtifactFormat::Onnx,
                manifest_digest: None,
                probe_inputs_digest: None,
                metrics: Default::default(),
                lineage: Default::default(),
                created_at: t(0),
                variants: Vec::new(),
            };
            assert!(store
                .model_versions
                .insert_new(&version_key("digits", v), &record)
                .unwrap());
        }
        store
    }

    #[tokio::test]
    async fn moves_are_recorded_with_who_when_from_and_to() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path()).await;
        let prod = alias("production");
        let (r, o) = set(&store, "digits", &prod, to("1"), "admin", t(1))
            .await
            .unwrap();
        assert_eq!((o, r.version.as_deref()), (SetOutcome::Created, Some("1")));
        // Pointing it where it points already writes nothing.
        let (r, o) = set(&store, "digits", &prod, to("1"), "admin", t(2))
            .await
            .unwrap();
        assert_eq!((o, r.history.len()), (SetOutcome::Unchanged, 1));
        let moved = SetAlias {
            version: "2".into(),
            reason: Some("better on recent data".into()),
        };
        let (r, o) = set(&store, "digits", &prod, moved, "admin", t(3))
            .await
            .unwrap();
        assert_eq!(o, SetOutcome::Moved);
        assert_eq!(
            resolve(&store, "digits", &prod).unwrap().as_deref(),
            Some("2")
        );
        assert_eq!(
            r.history,
            vec![
                AliasChange {
                    at: t(1),
                    by: "admin".into(),
                    from: None,
                    to: Some("1".into()),
                    reason: None
                },
                AliasChange {
                    at: t(3),
                    by: "admin".into(),
                    from: Some("1".into()),
                    to: Some("2".into()),
                    reason: Some("better on recent data".into())
                },
            ]
        );
        assert_eq!(r.updated_at, t(3));

        // Deleting keeps the history, and a deleted alias is not listed.
        let r = delete(&store, "digits", &prod, "admin", t(4))
            .await
            .unwrap();
        assert_eq!(r.version, None);
        assert_eq!(r.history.len(), 3);
        assert_eq!(r.history[2].from.as_deref(), Some("2"));
        assert_eq!(r.history[2].to, None);
        assert!(list(&store, "digits").unwrap().is_empty());
        assert!(matches!(
            get_current(&store, "digits", &prod),
            Err(Error::NotFound { .. })
        ));
        assert_eq!(get(&store, "digits", &prod).unwrap().history.len(), 3);
        assert!(matches!(
            delete(&store, "digits", &prod, "admin", t(5)).await,
            Err(Error::NotFound { .. })
        ));
        // Set again: created anew, on top of the old history.
        let (r, o) = set(&store, "digits", &prod, to("1"), "admin", t(6))
            .await
            .unwrap();
        assert_eq!((o, r.history.len()), (SetOutcome::Created, 4));
        assert_eq!(r.history[3].from, None);
    }

    #[tokio::test]
    async fn refusals_name_what_is_wrong_and_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path()).await;
        let staging = alias("staging");
        type Expected = fn(&Error) -> bool;
        let cases: Vec<(&str, &str, SetAlias, Expected)> = vec![
            ("no such model", "nope", to("1"), |e| {
                matches!(e, Error::NotFound { kind: "model", .. })
            }),
            ("no such version", "digits", to("9"), |e| {
                matches!(
                    e,
                    Error::NotFound {
                        kind: "model version",
                        ..
                    }
                )
            }),
            (
                "bad version",
                "digits",
                to("../1"),
                |e| matches!(e, Error::BadRequest { field: Some(f), .. } if f == "version"),
            ),
            (
                "reason with a newline",
                "digits",
                SetAlias {
                    version: "1".into(),
                    reason: Some("a\nb".into()),
                },
                |e| matches!(e, Error::BadRequest { field: Some(f), .. } if f == "reason"),
            ),
        ];
        for (name, model, req, expected) in cases {
            let e = set(&store, model, &staging, req, "admin", t(1))
                .await
                .unwrap_err();
            assert!(expected(&e), "{name}: {e:?}");
        }
        assert!(store.model_aliases.values().unwrap().is_empty());
    }

    #[tokio::test]
    async fn aliases_and_versions_never_share_a_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path()).await;
        // A version named like an alias blocks that alias...
        let record = ModelVersionRecord {
            version: "candidate".into(),
            ..store.model_versions.get("digits/1").unwrap().unwrap()
        };
        store
            .model_versions
            .insert("digits/candidate", &record)
            .unwrap();
        let e = set(
            &store,
            "digits",
            &alias("candidate"),
            to("1"),
            "admin",
            t(1),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(e, Error::Conflict(ref m) if m.contains("has a version")),
            "{e:?}"
        );
        // ...and an alias blocks a version of its name.
        set(
            &store,
            "digits",
            &alias("production"),
            to("1"),
            "admin",
            t(1),
        )
        .await
        .unwrap();
        assert!(points_somewhere(&store, "digits", "production").unwrap());
        assert!(!points_somewhere(&store, "digits", "1").unwrap());
        assert!(!points_somewhere(&store, "other", "production").unwrap());
    }

    #[test]
    fn history_keeps_the_newest() {
        let mut h = Vec::new();
        for i in 0..(MAX_HISTORY as i64 + 10) {
            push_history(
                &mut h,
                AliasChange {
                    at: t(i),
                    by: "admin".into(),
                    from: None,
                    to: Some(i.to_string()),
                    reason: None,
                },
            );
        }
        assert_eq!(h.len(), MAX_HISTORY);
        assert_eq!(h[0].at, t(10));
        assert_eq!(
            h[MAX_HISTORY - 1].to.as_deref(),
            Some(&*(MAX_HISTORY + 9).to_string())
        );
    }
}
