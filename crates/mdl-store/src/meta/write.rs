//! The write transaction: every change to the index, and the journal entries of those
//! the journal keeps.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use mdl_format::{ObjectId, Timestamp};
use redb::{ReadableTable, ReadableTableMetadata};

use super::read::{dependent_key, key_id};
use super::{
    CommitSummary, Expired, IndexEntry, RefValue, ReflogEntry, COMMITS, CONFIG, DEPENDENTS,
    EXPIRED, INFO, OBJECTS, PACKS_VERSION, PENDING, REFLOG, REFS, SHALLOW, TRIED,
};
use crate::error::db;
use crate::guard::guarded;
use crate::journal::{Change, Journal, JournalState};
use crate::StoreError;

/// A write transaction. Changes to refs, reflogs, configuration and expiry are also collected
/// for the journal, which receives them before the transaction commits.
pub struct MetaWrite<'m> {
    pub(super) txn: redb::WriteTransaction,
    pub(super) journal: &'m Journal,
    /// The database's [`Meta::failed`] flag, set if the commit fails.
    pub(super) failed: &'m AtomicBool,
    /// The database's count of committed writes ([`Meta::generation`]).
    pub(super) commits: &'m AtomicU64,
    pub(super) changes: Vec<Change>,
    /// Where a process that does not hold the database keeps it open for writing: emptied
    /// when the transaction ends (committed or not), so that other processes' reads are kept
    /// out only while a transaction publishes, not for the rest of this process's work.
    /// Declared after `txn`, so dropped after it.
    pub(super) _written: Release<'m>,
}

/// Empties a process's write handle of the database when dropped: it closes once the last
/// transaction using it has ended.
pub(super) struct Release<'m>(pub(super) Option<&'m Mutex<Option<Arc<redb::Database>>>>);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        if let Some(written) = self.0 {
            drop(super::lock(written).take());
        }
    }
}

impl MetaWrite<'_> {
    readers!();

    /// Adds or replaces an object's index entry.
    pub fn put_object(&mut self, id: &ObjectId, entry: &IndexEntry) -> Result<(), StoreError> {
        guarded(|| {
            if entry.pack.is_some() {
                // An mdl from before packs would take the entry for damage: it is told the
                // repository is newer than it instead.
                let mut info = self.txn.open_table(INFO).map_err(db)?;
                let version = info.get("repo_version").map_err(db)?.map(|v| v.value());
                if version.is_none_or(|v| v < PACKS_VERSION) {
                    info.insert("repo_version", PACKS_VERSION).map_err(db)?;
                }
            }
            let mut t = self.txn.open_table(OBJECTS).map_err(db)?;
            t.insert(id.as_bytes().as_slice(), entry.encode().as_slice())
                .map_err(db)?;
            Ok(())
        })
    }

    /// Queues the deferred re-encode of `commit`'s parent against it, after every one queued.
    pub fn push_pending(&mut self, commit: &ObjectId) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(PENDING).map_err(db)?;
            let next = t.last().map_err(db)?.map_or(0, |(k, _)| k.value() + 1);
            t.insert(next, commit.as_bytes().as_slice()).map_err(db)?;
            Ok(())
        })
    }

    /// Takes commit `commit`'s deferred re-encode (sequence number `seq`) off the queue (done,
    /// or nothing left to do), with what its stopped runs recorded as tried.
    pub fn remove_pending(&mut self, seq: u64, commit: &ObjectId) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(PENDING).map_err(db)?;
            t.remove(seq).map_err(db)?;
            let mut t = self.txn.open_table(TRIED).map_err(db)?;
            let lo = dependent_key(commit, &ObjectId::from_bytes([0; 32]));
            let hi = dependent_key(commit, &ObjectId::from_bytes([0xff; 32]));
            t.retain_in(lo.as_slice()..=hi.as_slice(), |_, _| false)
                .map_err(db)?;
            Ok(())
        })
    }

    /// Records that `commit`'s queued re-encode tried `prev` without a rewrite.
    pub fn mark_tried(&mut self, commit: &ObjectId, prev: &ObjectId) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(TRIED).map_err(db)?;
            t.insert(dependent_key(commit, prev).as_slice(), ())
                .map_err(db)?;
            Ok(())
        })
    }

    /// Records that `dependent`'s record is a delta against `base`.
    pub fn add_dependent(
        &mut self,
        base: &ObjectId,
        dependent: &ObjectId,
    ) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(DEPENDENTS).map_err(db)?;
            t.insert(dependent_key(base, dependent).as_slice(), ())
                .map_err(db)?;
            Ok(())
        })
    }

    /// Forgets that `dependent` decodes through `base` (its record changed).
    pub fn remove_dependent(
        &mut self,
        base: &ObjectId,
        dependent: &ObjectId,
    ) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(DEPENDENTS).map_err(db)?;
            t.remove(dependent_key(base, dependent).as_slice())
                .map_err(db)?;
            Ok(())
        })
    }

    /// Removes an object's index entry and its link to its delta base (the record file is the
    /// caller's to delete once this transaction is durable).
    pub fn remove_object(&mut self, id: &ObjectId) -> Result<Option<IndexEntry>, StoreError> {
        guarded(|| {
            let old = {
                let mut t = self.txn.open_table(OBJECTS).map_err(db)?;
                let v = t.remove(id.as_bytes().as_slice()).map_err(db)?;
                v.map(|v| IndexEntry::decode(v.value())).transpose()?
            };
            if let Some(base) = old.as_ref().and_then(|e| e.base) {
                self.remove_dependent(&base, id)?;
            }
            Ok(old)
        })
    }

    /// Removes a commit from the commit index.
    pub fn remove_commit(&mut self, id: &ObjectId) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(COMMITS).map_err(db)?;
            t.remove(id.as_bytes().as_slice()).map_err(db)?;
            Ok(())
        })
    }

    /// Records that a retention rule deleted `id`.
    pub fn put_expired(&mut self, id: &ObjectId, e: &Expired) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(EXPIRED).map_err(db)?;
            t.insert(id.as_bytes().as_slice(), e.encode().as_slice())
                .map_err(db)?;
            Ok(())
        })?;
        self.changes.push(Change::Expired {
            id: *id,
            value: Some(e.clone()),
        });
        Ok(())
    }

    /// Forgets that `id` expired (it was stored again, e.g. a later commit has the same tensor).
    pub fn remove_expired(&mut self, id: &ObjectId) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(EXPIRED).map_err(db)?;
            t.remove(id.as_bytes().as_slice()).map_err(db)?;
            Ok(())
        })?;
        self.changes.push(Change::Expired {
            id: *id,
            value: None,
        });
        Ok(())
    }

    /// Marks commit `id` as where history was cut (`cut`: its parents are not here, on
    /// purpose), or takes the mark away (its parents came).
    pub fn set_shallow(&mut self, id: &ObjectId, cut: bool) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(SHALLOW).map_err(db)?;
            match cut {
                true => t.insert(id.as_bytes().as_slice(), ()).map(drop),
                false => t.remove(id.as_bytes().as_slice()).map(drop),
            }
            .map_err(db)
        })?;
        self.changes.push(Change::Shallow { id: *id, cut });
        Ok(())
    }

    /// Deletes the reflog entries of `name` older than `before`; returns how many.
    pub fn expire_reflog(&mut self, name: &str, before: Timestamp) -> Result<usize, StoreError> {
        let removed = guarded(|| {
            let mut log = self.txn.open_table(REFLOG).map_err(db)?;
            let mut removed = 0;
            log.retain_in((name, 0)..=(name, u64::MAX), |_, v| {
                let keep = ReflogEntry::decode(v).map_or(true, |e| e.time >= before);
                removed += usize::from(!keep);
                keep
            })
            .map_err(db)?;
            Ok(removed)
        })?;
        if removed > 0 {
            self.changes.push(Change::ExpireReflog {
                name: name.to_string(),
                before,
            });
        }
        Ok(removed)
    }

    /// Adds a commit to the commit index.
    pub fn put_commit(&mut self, id: &ObjectId, summary: &CommitSummary) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(COMMITS).map_err(db)?;
            t.insert(id.as_bytes().as_slice(), summary.encode().as_slice())
                .map_err(db)?;
            Ok(())
        })
    }

    /// Sets a configuration value.
    pub fn set_config(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        guarded(|| {
            let mut t = self.txn.open_table(CONFIG).map_err(db)?;
            t.insert(key, value).map_err(db)?;
            Ok(())
        })?;
        self.changes.push(Change::Config {
            key: key.to_string(),
            value: Some(value.to_string()),
        });
        Ok(())
    }

    /// Removes a configuration value; whether there was one.
    pub fn remove_config(&mut self, key: &str) -> Result<bool, StoreError> {
        let had = guarded(|| {
            let mut t = self.txn.open_table(CONFIG).map_err(db)?;
            let had = t.remove(key).map_err(db)?.is_some();
            Ok(had)
        })?;
        if had {
            self.changes.push(Change::Config {
                key: key.to_string(),
                value: None,
            });
        }
        Ok(had)
    }

    /// Compare-and-swap of a ref: succeeds only if its current value equals `expected`
    /// (`None`: must not exist). `new = None` deletes the ref; its reflog stays, the deletion
    /// its last entry. Every change appends a reflog entry in the same transaction.
    pub fn update_ref(
        &mut self,
        name: &str,
        expected: Option<&RefValue>,
        new: Option<&RefValue>,
        message: &str,
    ) -> Result<(), StoreError> {
        let current = self.get_ref(name)?;
        if current.as_ref() != expected {
            let show = |v: Option<&RefValue>| match v {
                None => "nothing".to_string(),
                Some(RefValue::Symbolic(s)) => s.clone(),
                Some(v) => v.target().map(|t| t.short(12)).unwrap_or_default(),
            };
            return Err(StoreError::RefConflict {
                name: name.to_string(),
                expected: show(expected),
                found: show(current.as_ref()),
            });
        }
        let entry = ReflogEntry {
            old: current.as_ref().and_then(RefValue::target),
            new: new.and_then(RefValue::target),
            time: Timestamp::now(),
            message: message.to_string(),
        };
        // A deleted ref's reflog stays (what it pointed at can be found again until gc
        // expires the entries), with the deletion as its last entry.
        let kept = guarded(|| {
            let mut refs = self.txn.open_table(REFS).map_err(db)?;
            let mut log = self.txn.open_table(REFLOG).map_err(db)?;
            match new {
                Some(v) => refs.insert(name, v.encode().as_slice()).map_err(db)?,
                None => refs.remove(name).map_err(db)?,
            };
            let mut kept = Vec::new();
            if new.is_none() {
                for item in log.range((name, 0)..=(name, u64::MAX)).map_err(db)? {
                    kept.push(ReflogEntry::decode(item.map_err(db)?.1.value())?);
                }
            }
            let next = log
                .range((name, 0)..=(name, u64::MAX))
                .map_err(db)?
                .next_back()
                .transpose()
                .map_err(db)?
                .map(|(k, _)| k.value().1 + 1)
                .unwrap_or(0);
            log.insert((name, next), entry.encode().as_slice())
                .map_err(db)?;
            Ok(kept)
        })?;
        self.changes.push(Change::Ref {
            name: name.to_string(),
            value: new.cloned(),
        });
        // The journal's deletion drops the reflog (as builds before this one did), so the
        // entries kept follow it again.
        for entry in kept.into_iter().chain([entry]) {
            self.changes.push(Change::Reflog {
                name: name.to_string(),
                entry,
            });
        }
        Ok(())
    }

    /// Makes every change durable and visible, atomically. Changes to refs, reflogs,
    /// configuration and expiry reach the journal (durably) first; if the database then fails
    /// to commit, an abort entry follows them.
    pub fn commit_txn(self) -> Result<(), StoreError> {
        if !self.changes.is_empty() {
            self.journal.append(&self.changes)?;
        }
        let result = guarded(|| self.txn.commit().map_err(db));
        // Counted whether or not it took: a failed commit may still have changed the file.
        self.commits.fetch_add(1, Ordering::Release);

        if result.is_err() {
            self.failed.store(true, Ordering::Relaxed);
            if !self.changes.is_empty() {
                let _ = self.journal.append(&[Change::Abort]);
            }
        }
        result
    }
}
