//! `mdl stats`: how much the repository holds and how well it compresses.

use serde::{Deserialize, Serialize};

use crate::{Repository, Result};

/// Repository totals (the stable `--json` form of `mdl stats`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Stats {
    /// Commits.
    pub commits: u64,
    /// Objects in the index (tensors, manifests, commits).
    pub objects: u64,
    /// Bytes of all committed checkpoint files together.
    pub raw_bytes: u64,
    /// Bytes of all records.
    pub stored_bytes: u64,
    /// `raw_bytes / stored_bytes`.
    pub ratio: f64,
    /// Commits whose reverse re-encodes are still queued (`delta.defer`): until `mdl maintenance`
    /// (or the background run a commit starts) has done them, `stored_bytes` is larger than it
    /// will be.
    #[serde(default)]
    pub pending_reencodes: u64,
}

/// Computes the totals from the index.
pub fn stats(repo: &Repository) -> Result<Stats> {
    let meta = repo.store().meta().read()?;
    let commits = meta.commits()?;
    let objects = meta.objects()?;
    let raw_bytes: u64 = commits.iter().map(|(_, s)| s.raw_bytes).sum();
    let stored_bytes: u64 = objects.iter().map(|(_, e)| e.stored_len).sum();
    let pending_reencodes = meta.pending_count()?;
    Ok(Stats {
        commits: commits.len() as u64,
        objects: objects.len() as u64,
        raw_bytes,
        stored_bytes,
        ratio: if stored_bytes == 0 {
            0.0
        } else {
            raw_bytes as f64 / stored_bytes as f64
        },
        pending_reencodes,
    })
}
