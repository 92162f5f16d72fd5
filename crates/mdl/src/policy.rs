//! Delta policy: whether and how commits store tensors as XOR deltas, from the repository
//! configuration (`delta.mode`, `delta.max_depth`; see `docs/DECISIONS.md` for the defaults).

use std::fmt;
use std::str::FromStr;

use mdl_store::Store;

use crate::{Error, Result};

/// Configuration key of [`DeltaPolicy::mode`].
pub const MODE_KEY: &str = "delta.mode";
/// Configuration key of [`DeltaPolicy::max_depth`].
pub const MAX_DEPTH_KEY: &str = "delta.max_depth";

/// Which way deltas point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeltaMode {
    /// The new tensor is stored whole and its previous version is re-encoded as a delta
    /// against it, so the newest commit never decodes through a chain.
    Reverse,
    /// The new tensor is stored as a delta against its previous version (cheapest commit,
    /// slowest restore of the newest commit).
    Forward,
    /// No deltas: every tensor is self-contained.
    Off,
}

impl FromStr for DeltaMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "reverse" => Ok(DeltaMode::Reverse),
            "forward" => Ok(DeltaMode::Forward),
            "off" => Ok(DeltaMode::Off),
            _ => Err(Error::InvalidConfig {
                key: MODE_KEY.into(),
                value: s.into(),
                expected: "reverse, forward or off",
            }),
        }
    }
}

impl fmt::Display for DeltaMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeltaMode::Reverse => "reverse",
            DeltaMode::Forward => "forward",
            DeltaMode::Off => "off",
        })
    }
}

/// How commits use deltas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaPolicy {
    /// Direction.
    pub mode: DeltaMode,
    /// Longest chain of delta steps any object may need (a new base starts beyond it).
    pub max_depth: u32,
}

impl Default for DeltaPolicy {
    fn default() -> Self {
        DeltaPolicy {
            mode: DeltaMode::Reverse,
            max_depth: 16,
        }
    }
}

impl DeltaPolicy {
    /// The repository's policy: its configuration over the defaults.
    pub fn from_store(store: &Store) -> Result<DeltaPolicy> {
        let meta = store.meta().read()?;
        let mut p = DeltaPolicy::default();
        if let Some(v) = meta.config(MODE_KEY)? {
            p.mode = v.parse()?;
        }
        if let Some(v) = meta.config(MAX_DEPTH_KEY)? {
            p.max_depth = parse_depth(&v)?;
        }
        Ok(p)
    }
}

/// Validates a `delta.max_depth` value.
pub fn parse_depth(v: &str) -> Result<u32> {
    v.parse::<u32>()
        .ok()
        .filter(|&d| d <= mdl_store::MAX_CHAIN / 2)
        .ok_or_else(|| Error::InvalidConfig {
            key: MAX_DEPTH_KEY.into(),
            value: v.into(),
            expected: "a whole number from 0 to 512",
        })
}

/// Checks a configuration assignment before it is stored.
pub fn validate(key: &str, value: &str) -> Result<()> {
    match key {
        MODE_KEY => value.parse::<DeltaMode>().map(drop),
        MAX_DEPTH_KEY => parse_depth(value).map(drop),
        _ => crate::lossy::validate(key, value)
            .unwrap_or_else(|| Err(Error::UnknownConfig(key.into()))),
    }
}

/// Every configuration key, with its default.
pub fn known_keys() -> Vec<(&'static str, String)> {
    let d = DeltaPolicy::default();
    let mut keys = vec![
        (MODE_KEY, d.mode.to_string()),
        (MAX_DEPTH_KEY, d.max_depth.to_string()),
    ];
    keys.extend(crate::lossy::known_keys());
    keys
}

/// Every configuration key with its value and whether it is set (rather than the default).
pub fn config(repo: &crate::Repository) -> Result<Vec<(String, String, bool)>> {
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
pub fn set_config(repo: &crate::Repository, key: &str, value: &str) -> Result<()> {
    validate(key, value)?;
    let mut w = repo.store().meta().write()?;
    w.set_config(key, value)?;
    w.commit_txn()?;
    Ok(())
}
