//! `mdl stats`: how much the repository holds and how well it compresses.

pub use mdl_protocol::outcome::Stats;

use crate::{Repository, Result};

/// Computes the totals from the index; with `lossy`, HEAD's series under the lossy papers'
/// accountings too (which reads every manifest of its history).
pub fn stats(repo: &Repository, lossy: bool) -> Result<Stats> {
    let meta = repo.store().meta().read()?;
    let commits = meta.commits()?;
    let objects = meta.objects()?;
    let pending_reencodes = meta.pending_count()?;
    drop(meta);
    let raw_bytes: u64 = commits.iter().map(|(_, s)| s.raw_bytes).sum();
    let stored_bytes: u64 = objects.iter().map(|(_, e)| e.stored_len).sum();
    let lossy = if lossy {
        let stored_lens = objects.iter().map(|(id, e)| (*id, e.stored_len)).collect();
        crate::accounting::accounting(repo, &stored_lens)?
    } else {
        None
    };
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
        tips_bytes: repo.store().tips_bytes(),
        lossy,
    })
}
