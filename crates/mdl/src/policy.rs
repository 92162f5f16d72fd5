//! Delta policy: whether and how commits store tensors as XOR deltas, from the repository
//! configuration (`delta.mode`, `delta.max_depth`, `delta.max_restore_cost`, `delta.defer`; see
//! `docs/DECISIONS.md` for the defaults).

use std::fmt;
use std::str::FromStr;

use mdl_store::Store;

use crate::{Error, Result};

/// Configuration key of [`DeltaPolicy::mode`].
pub const MODE_KEY: &str = "delta.mode";
/// Configuration key of [`DeltaPolicy::max_depth`].
pub const MAX_DEPTH_KEY: &str = "delta.max_depth";
/// Configuration key of [`DeltaPolicy::max_restore_cost`].
pub const MAX_RESTORE_COST_KEY: &str = "delta.max_restore_cost";
/// Configuration key of [`DeltaPolicy::defer`].
pub const DEFER_KEY: &str = "delta.defer";

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
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeltaPolicy {
    /// Direction.
    pub mode: DeltaMode,
    /// Longest chain of delta steps any object may need (a new base starts beyond it).
    pub max_depth: u32,
    /// Most record bytes a tensor's reconstruction may read (its own record and every base),
    /// as a multiple of the tensor's size; a new base starts beyond it. `None`: no such cap.
    pub max_restore_cost: Option<f64>,
    /// Reverse mode: a commit stores its new versions whole and leaves the re-encode of the
    /// previous versions as deltas against them to [`crate::commit::run_deferred`], after the
    /// commit is published (so a commit costs what a first commit costs). On by default.
    pub defer: bool,
}

impl Default for DeltaPolicy {
    fn default() -> Self {
        DeltaPolicy {
            mode: DeltaMode::Reverse,
            max_depth: 16,
            max_restore_cost: None,
            defer: true,
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
        if let Some(v) = meta.config(MAX_RESTORE_COST_KEY)? {
            p.max_restore_cost = parse_restore_cost(&v)?;
        }
        if let Some(v) = meta.config(DEFER_KEY)? {
            p.defer = parse_defer(&v)?;
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

/// Validates a `delta.max_restore_cost` value: `none`, or a multiple of at least 1.
pub fn parse_restore_cost(v: &str) -> Result<Option<f64>> {
    if v == "none" {
        return Ok(None);
    }
    v.parse::<f64>()
        .ok()
        .filter(|c| c.is_finite() && *c >= 1.0)
        .map(Some)
        .ok_or_else(|| Error::InvalidConfig {
            key: MAX_RESTORE_COST_KEY.into(),
            value: v.into(),
            expected: "none, or a number of at least 1 (bytes read per byte restored)",
        })
}

/// Validates a `delta.defer` value.
pub fn parse_defer(v: &str) -> Result<bool> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(Error::InvalidConfig {
            key: DEFER_KEY.into(),
            value: v.into(),
            expected: "true or false",
        }),
    }
}
