//! The repository's configuration: every key mdl knows, its default, and the check a value
//! passes before it is stored. The keys belong to the modules that read them (delta policy,
//! retention, engine, lossy codecs); this is the one registry that lists them all.

use crate::engine::{self, EngineChoice};
use crate::policy::{self, DeltaMode, DeltaPolicy};
use crate::{coarsen, gc, limits, lossy, Error, Repository, Result};
use mdl_protocol::limits::{self as remote, Deadlines};

/// Checks a configuration assignment before it is stored.
pub fn validate(key: &str, value: &str) -> Result<()> {
    match key {
        policy::MODE_KEY => value.parse::<DeltaMode>().map(drop),
        policy::MAX_DEPTH_KEY => policy::parse_depth(value).map(drop),
        policy::MAX_RESTORE_COST_KEY => policy::parse_restore_cost(value).map(drop),
        policy::DEFER_KEY => policy::parse_defer(value).map(drop),
        gc::KEEP_LAST_KEY => gc::KEEP_LAST.parse(value).map(drop),
        coarsen::COARSEN_AFTER_KEY => coarsen::COARSEN_AFTER.parse(value).map(drop),
        engine::ENGINE_KEY => value.parse::<EngineChoice>().map(drop),
        _ if remote::KEYS.contains(&key) => Deadlines::default()
            .set(key, value)
            .map(drop)
            .map_err(|expected| invalid_remote(key, value, expected)),
        _ => match limits::ALL.iter().find(|l| l.key == key) {
            Some(limit) => limit.parse(value).map(drop),
            None => {
                lossy::validate(key, value).unwrap_or_else(|| Err(Error::UnknownConfig(key.into())))
            }
        },
    }
}

/// Every configuration key, with its default.
pub fn known_keys() -> Vec<(&'static str, String)> {
    let d = DeltaPolicy::default();
    let mut keys = vec![
        (policy::MODE_KEY, d.mode.to_string()),
        (policy::MAX_DEPTH_KEY, d.max_depth.to_string()),
        (policy::MAX_RESTORE_COST_KEY, "none".to_string()),
        (policy::DEFER_KEY, d.defer.to_string()),
        (gc::KEEP_LAST_KEY, gc::KEEP_LAST.off.to_string()),
        (
            coarsen::COARSEN_AFTER_KEY,
            coarsen::COARSEN_AFTER.off.to_string(),
        ),
        (engine::ENGINE_KEY, EngineChoice::default().to_string()),
    ];
    keys.extend(limits::ALL.iter().map(|l| (l.key, l.default.to_string())));
    keys.extend(remote::KEYS.into_iter().zip(Deadlines::default().values()));
    keys.extend(lossy::known_keys());
    keys
}

/// Every configuration key with its value and whether it is set (rather than the default).
pub fn config(repo: &Repository) -> Result<Vec<(String, String, bool)>> {
    let meta = repo.store().meta().read()?;
    known_keys()
        .into_iter()
        .map(|(k, default)| {
            Ok(match meta.config(k)? {
                Some(v) => (k.to_string(), v, true),
                None => (k.to_string(), default, false),
            })
        })
        .collect()
}

/// Validates and stores a configuration value.
pub fn set_config(repo: &Repository, key: &str, value: &str) -> Result<()> {
    validate(key, value)?;
    let mut w = repo.store().meta().write()?;
    w.set_config(key, value)?;
    w.commit_txn()?;
    Ok(())
}

/// The value of `key` as stored (`None` when it is not set).
pub fn get(repo: &Repository, key: &str) -> Result<Option<String>> {
    Ok(repo.store().meta().read()?.config(key)?)
}

/// Every stored key starting with `prefix`, with its value.
pub fn with_prefix(repo: &Repository, prefix: &str) -> Result<Vec<(String, String)>> {
    Ok(repo.store().meta().read()?.configs(prefix)?)
}

/// Stores `key = value` copied from another copy of this repository (the settings of a
/// repository in object storage): a key of the registry is checked as by [`set_config`]; a
/// key that carries a name of the user's (`remote.NAME.url`, see [`add`]) is stored as it is,
/// its value checked by its owner where it was added.
pub fn set_copied(repo: &Repository, key: &str, value: &str) -> Result<()> {
    let named = key.starts_with("remote.") && key.ends_with(".url");
    if !named {
        validate(key, value)?;
    }
    let mut w = repo.store().meta().write()?;
    w.set_config(key, value)?;
    w.commit_txn()?;
    Ok(())
}

/// Removes `key` (a remote's setting, see [`add`]); whether it was set.
pub fn remove(repo: &Repository, key: &str) -> Result<bool> {
    let mut w = repo.store().meta().write()?;
    let had = w.remove_config(key)?;
    w.commit_txn()?;
    Ok(had)
}

/// Stores `key = value` unless `key` is already set; whether it was stored. For keys whose
/// names carry a name of the user's (`remote.NAME.url`), which the registry above does not list;
/// their owner checks the value.
pub fn add(repo: &Repository, key: &str, value: &str) -> Result<bool> {
    let mut w = repo.store().meta().write()?;
    if w.config(key)?.is_some() {
        return Ok(false);
    }
    w.set_config(key, value)?;
    w.commit_txn()?;
    Ok(true)
}

/// How long commands wait for a server, and how slow a transfer may be: the defaults, then the
/// repository's `remote.*` settings when there is one, then the environment's
/// (`MDL_REMOTE_…`), which wins.
pub fn deadlines(repo: Option<&Repository>) -> Result<Deadlines> {
    let mut d = Deadlines::default();
    if let Some(repo) = repo {
        for key in remote::KEYS {
            if let Some(value) = get(repo, key)? {
                d.set(key, &value)
                    .map_err(|expected| invalid_remote(key, &value, expected))?;
            }
        }
    }
    for key in remote::KEYS {
        let name = remote::env_name(key);
        if let Ok(value) = std::env::var(&name) {
            d.set(key, &value)
                .map_err(|expected| invalid_remote(&name, &value, expected))?;
        }
    }
    Ok(d)
}

/// A `remote.*` setting (or its variable, `MDL_REMOTE_…`) that does not read.
fn invalid_remote(key: &str, value: &str, expected: &'static str) -> Error {
    Error::InvalidConfig {
        key: key.to_string(),
        value: value.to_string(),
        expected,
    }
}
