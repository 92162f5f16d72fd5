//! What read and write transactions both read: one macro of readers, expanded in
//! [`super::MetaRead`] and [`super::MetaWrite`], and the keys the index tables use.

use mdl_format::ObjectId;

use crate::StoreError;

/// Read access shared by read and write transactions.
macro_rules! readers {
    () => {
        /// The oldest commit whose deferred re-encode is pending, with its sequence number.
        pub fn pending_first(&self) -> Result<Option<(u64, ObjectId)>, StoreError> {
            guarded(|| {
                let t = match self.txn.open_table(PENDING) {
                    Ok(t) => t,
                    // Repositories written before deferred re-encodes have no such table.
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                    Err(e) => return Err(db(e)),
                };
                let first = t.first().map_err(db)?;
                first
                    .map(|(k, v)| Ok((k.value(), key_id(v.value())?)))
                    .transpose()
            })
        }

        /// How many commits' deferred re-encodes are pending.
        pub fn pending_count(&self) -> Result<u64, StoreError> {
            guarded(|| match self.txn.open_table(PENDING) {
                Ok(t) => t.len().map_err(db),
                Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
                Err(e) => Err(db(e)),
            })
        }

        /// Whether a run of `commit`'s queued re-encode tried `prev` without a rewrite.
        pub fn tried(&self, commit: &ObjectId, prev: &ObjectId) -> Result<bool, StoreError> {
            guarded(|| match self.txn.open_table(TRIED) {
                Ok(t) => Ok(t
                    .get(dependent_key(commit, prev).as_slice())
                    .map_err(db)?
                    .is_some()),
                Err(redb::TableError::TableDoesNotExist(_)) => Ok(false),
                Err(e) => Err(db(e)),
            })
        }

        /// A ref's value.
        pub fn get_ref(&self, name: &str) -> Result<Option<RefValue>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(REFS).map_err(db)?;
                let v = t.get(name).map_err(db)?;
                v.map(|v| RefValue::decode(v.value())).transpose()
            })
        }

        /// Refs whose names start with `prefix`, in name order.
        pub fn refs(&self, prefix: &str) -> Result<Vec<(String, RefValue)>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(REFS).map_err(db)?;
                let mut out = Vec::new();
                for item in t.range(prefix..).map_err(db)? {
                    let (k, v) = item.map_err(db)?;
                    if !k.value().starts_with(prefix) {
                        break;
                    }
                    out.push((k.value().to_string(), RefValue::decode(v.value())?));
                }
                Ok(out)
            })
        }

        /// The reflog of a ref, oldest first.
        pub fn reflog(&self, name: &str) -> Result<Vec<ReflogEntry>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(REFLOG).map_err(db)?;
                let mut out = Vec::new();
                for item in t.range((name, 0)..=(name, u64::MAX)).map_err(db)? {
                    let (_, v) = item.map_err(db)?;
                    out.push(ReflogEntry::decode(v.value())?);
                }
                Ok(out)
            })
        }

        /// An object's index entry.
        pub fn object(&self, id: &ObjectId) -> Result<Option<IndexEntry>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(OBJECTS).map_err(db)?;
                let v = t.get(id.as_bytes().as_slice()).map_err(db)?;
                v.map(|v| IndexEntry::decode(v.value())).transpose()
            })
        }

        /// Every indexed object, in id order.
        pub fn objects(&self) -> Result<Vec<(ObjectId, IndexEntry)>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(OBJECTS).map_err(db)?;
                let mut out = Vec::new();
                for item in t.iter().map_err(db)? {
                    let (k, v) = item.map_err(db)?;
                    out.push((key_id(k.value())?, IndexEntry::decode(v.value())?));
                }
                Ok(out)
            })
        }

        /// A commit's summary.
        pub fn commit(&self, id: &ObjectId) -> Result<Option<CommitSummary>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(COMMITS).map_err(db)?;
                let v = t.get(id.as_bytes().as_slice()).map_err(db)?;
                v.map(|v| CommitSummary::decode(v.value())).transpose()
            })
        }

        /// Every commit, in id order.
        pub fn commits(&self) -> Result<Vec<(ObjectId, CommitSummary)>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(COMMITS).map_err(db)?;
                let mut out = Vec::new();
                for item in t.iter().map_err(db)? {
                    let (k, v) = item.map_err(db)?;
                    out.push((key_id(k.value())?, CommitSummary::decode(v.value())?));
                }
                Ok(out)
            })
        }

        /// Commits whose id starts with `prefix`.
        pub fn commits_with_prefix(
            &self,
            prefix: &mdl_format::IdPrefix,
        ) -> Result<Vec<ObjectId>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(COMMITS).map_err(db)?;
                let lower = prefix.lower_bound();
                let mut out = Vec::new();
                for item in t.range(lower.as_bytes().as_slice()..).map_err(db)? {
                    let (k, _) = item.map_err(db)?;
                    let id = key_id(k.value())?;
                    if !prefix.matches(&id) {
                        break;
                    }
                    out.push(id);
                }
                Ok(out)
            })
        }

        /// Objects whose records name `base` as their delta base.
        pub fn dependents(&self, base: &ObjectId) -> Result<Vec<ObjectId>, StoreError> {
            guarded(|| {
                let t = match self.txn.open_table(DEPENDENTS) {
                    Ok(t) => t,
                    // Repositories written before delta codecs have no such table yet.
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                    Err(e) => return Err(db(e)),
                };
                let lo = dependent_key(base, &ObjectId::from_bytes([0; 32]));
                let hi = dependent_key(base, &ObjectId::from_bytes([0xff; 32]));
                let mut out = Vec::new();
                for item in t.range(lo.as_slice()..=hi.as_slice()).map_err(db)? {
                    let (k, _) = item.map_err(db)?;
                    out.push(key_id(&k.value()[32..])?);
                }
                Ok(out)
            })
        }

        /// Whether (and how) a retention rule deleted an object.
        pub fn expired(&self, id: &ObjectId) -> Result<Option<Expired>, StoreError> {
            guarded(|| {
                let t = match self.txn.open_table(EXPIRED) {
                    Ok(t) => t,
                    // Repositories written before retention rules have no such table yet.
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                    Err(e) => return Err(db(e)),
                };
                let v = t.get(id.as_bytes().as_slice()).map_err(db)?;
                v.map(|v| Expired::decode(v.value())).transpose()
            })
        }

        /// Every object deleted by a retention rule, in id order.
        pub fn expired_all(&self) -> Result<Vec<(ObjectId, Expired)>, StoreError> {
            guarded(|| {
                let t = match self.txn.open_table(EXPIRED) {
                    Ok(t) => t,
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                    Err(e) => return Err(db(e)),
                };
                let mut out = Vec::new();
                for item in t.iter().map_err(db)? {
                    let (k, v) = item.map_err(db)?;
                    out.push((key_id(k.value())?, Expired::decode(v.value())?));
                }
                Ok(out)
            })
        }

        /// The commits whose parents are not here on purpose (where a shallow clone's history
        /// was cut), in id order.
        pub fn shallow(&self) -> Result<Vec<ObjectId>, StoreError> {
            guarded(|| {
                let t = match self.txn.open_table(SHALLOW) {
                    Ok(t) => t,
                    // Repositories that were never shallow need not have the table.
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                    Err(e) => return Err(db(e)),
                };
                let mut out = Vec::new();
                for item in t.iter().map_err(db)? {
                    let (k, _) = item.map_err(db)?;
                    out.push(key_id(k.value())?);
                }
                Ok(out)
            })
        }

        /// Names of the refs that have reflog entries.
        pub fn reflog_names(&self) -> Result<Vec<String>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(REFLOG).map_err(db)?;
                let mut out: Vec<String> = Vec::new();
                for item in t.iter().map_err(db)? {
                    let (k, _) = item.map_err(db)?;
                    let name = k.value().0;
                    if out.last().map(String::as_str) != Some(name) {
                        out.push(name.to_string());
                    }
                }
                Ok(out)
            })
        }

        /// A configuration value.
        pub fn config(&self, key: &str) -> Result<Option<String>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(CONFIG).map_err(db)?;
                let v = t.get(key).map_err(db)?;
                Ok(v.map(|v| v.value().to_string()))
            })
        }

        /// Configuration values whose keys start with `prefix`, in key order.
        pub fn configs(&self, prefix: &str) -> Result<Vec<(String, String)>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(CONFIG).map_err(db)?;
                let mut out = Vec::new();
                for item in t.range(prefix..).map_err(db)? {
                    let (k, v) = item.map_err(db)?;
                    if !k.value().starts_with(prefix) {
                        break;
                    }
                    out.push((k.value().to_string(), v.value().to_string()));
                }
                Ok(out)
            })
        }

        /// What the journal must hold for this database: refs, reflogs, configuration, records
        /// of expiry and the shallow cut.
        pub fn journaled(&self) -> Result<JournalState, StoreError> {
            let mut state = JournalState::default();
            for (name, value) in self.refs("")? {
                state.refs.insert(name, value);
            }
            for name in self.reflog_names()? {
                let log = self.reflog(&name)?;
                state.reflogs.insert(name, log);
            }
            state.config = self.configs("")?.into_iter().collect();
            state.expired = self.expired_all()?.into_iter().collect();
            state.shallow = self.shallow()?.into_iter().collect();
            Ok(state)
        }

        #[allow(dead_code)]
        fn info(&self, key: &str) -> Result<Option<u64>, StoreError> {
            guarded(|| {
                let t = self.txn.open_table(INFO).map_err(db)?;
                let v = t.get(key).map_err(db)?;
                Ok(v.map(|v| v.value()))
            })
        }
    };
}

pub(crate) fn dependent_key(base: &ObjectId, dependent: &ObjectId) -> [u8; 64] {
    let mut k = [0u8; 64];
    k[..32].copy_from_slice(base.as_bytes());
    k[32..].copy_from_slice(dependent.as_bytes());
    k
}

pub(crate) fn key_id(k: &[u8]) -> Result<ObjectId, StoreError> {
    let bytes: [u8; 32] = k
        .try_into()
        .map_err(|_| StoreError::Malformed("object key"))?;
    Ok(ObjectId::from_bytes(bytes))
}
