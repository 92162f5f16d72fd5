//! What receiving packs added to a repository, kept so that a transfer refused after the fact
//! (a pack that fails half-way, refs that name what never came) leaves the repository exactly
//! as it was: its records taken out of the index and off the disk again.

use mdl_format::ObjectId;
use mdl_store::Expired;

use crate::{Repository, Result};

/// What packs added (see the module's documentation).
#[derive(Clone, Debug, Default)]
pub struct Added {
    /// Every record written, indexed or not, with its generation.
    pub(super) records: Vec<(ObjectId, u32)>,
    /// The packs written (holding some of `records`).
    pub(super) packs: Vec<u64>,
    /// Commits named in the commit index.
    pub(super) commits: Vec<ObjectId>,
    /// Records of expiry made for tensors a received manifest names.
    pub(super) expired: Vec<ObjectId>,
    /// Records of expiry that indexing a received tensor replaced.
    pub(super) unexpired: Vec<(ObjectId, Expired)>,
    /// Received commits marked cut (their parents did not come).
    pub(super) cut: Vec<ObjectId>,
    /// Commits marked cut before whose parents came: the marks taken away.
    pub(super) joined: Vec<ObjectId>,
}

impl Added {
    /// Adds what another pack added.
    pub fn extend(&mut self, other: Added) {
        self.records.extend(other.records);
        self.packs.extend(other.packs);
        self.commits.extend(other.commits);
        self.expired.extend(other.expired);
        self.unexpired.extend(other.unexpired);
        self.cut.extend(other.cut);
        self.joined.extend(other.joined);
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty() && self.expired.is_empty()
    }

    /// Takes it all out again: out of the index in one transaction (the records of expiry it
    /// replaced put back), then the record files and packs removed. Only for the process that received
    /// it, still holding the repository's writer: no ref can name any of it, and nothing else
    /// can have come to use it. A failure is logged; `mdl gc` removes what stays.
    pub fn undo(self, repo: &Repository) {
        if self.is_empty() {
            return;
        }
        let store = repo.store();
        let unindexed = (|| -> Result<()> {
            let mut w = store.meta().write()?;
            for id in &self.commits {
                w.remove_commit(id)?;
            }
            for (id, _) in self.records.iter().rev() {
                w.remove_object(id)?;
            }
            for id in &self.expired {
                w.remove_expired(id)?;
            }
            for (id, x) in &self.unexpired {
                w.put_expired(id, x)?;
            }
            for id in &self.cut {
                w.set_shallow(id, false)?;
            }
            for id in &self.joined {
                w.set_shallow(id, true)?;
            }
            w.commit_txn()?;
            Ok(())
        })();
        match unindexed {
            Ok(()) => {
                for (id, generation) in &self.records {
                    store.remove_record(id, *generation);
                }
                for pack in &self.packs {
                    store.remove_pack(*pack);
                }
                tracing::info!(
                    "removed the {} records of a refused transfer",
                    self.records.len()
                );
            }
            Err(e) => tracing::warn!(
                "could not remove what a refused transfer added ({e}); `mdl gc` removes it"
            ),
        }
    }
}
