//! The values `meta.redb` stores, and their encodings (versioned, little-endian, documented in
//! `docs/FORMAT.md`): index entries, expiry notes, commit summaries, refs and reflog entries.

use mdl_format::{ObjectId, ObjectKind, Timestamp};

use crate::StoreError;

/// Where an object's record lives and how it is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// Kind of object.
    pub kind: ObjectKind,
    /// Codec tag of the record.
    pub codec: u8,
    /// Generation of the record (a loose one's file is `objects/ab/<rest>.<generation>`);
    /// re-encoding an object writes a new generation and switches the index to it.
    pub generation: u32,
    /// Delta base, if the codec has one.
    pub base: Option<ObjectId>,
    /// Decode steps to reconstruct the object (0 for a self-contained record).
    pub depth: u32,
    /// Size of the record.
    pub stored_len: u64,
    /// Size of the decoded data (the bytes checkout writes, without the canonical prefix).
    pub content_len: u64,
    /// When the record was written.
    pub created: Timestamp,
    /// The pack the record is in, and where (`None`: a loose record file).
    pub pack: Option<Packed>,
}

/// Where a record in a pack lies: the pack's number (`packs/<16 hex digits>.pack`) and the
/// record's offset in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packed {
    /// The pack's number.
    pub pack: u64,
    /// Where the record starts in the pack file.
    pub offset: u64,
}

impl IndexEntry {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(88);
        let version = if self.pack.is_some() { 2 } else { 1 };
        v.extend_from_slice(&[
            version,
            self.kind as u8,
            self.codec,
            self.base.is_some() as u8,
        ]);
        v.extend_from_slice(&self.generation.to_le_bytes());
        if let Some(b) = &self.base {
            v.extend_from_slice(b.as_bytes());
        }
        v.extend_from_slice(&self.depth.to_le_bytes());
        v.extend_from_slice(&self.stored_len.to_le_bytes());
        v.extend_from_slice(&self.content_len.to_le_bytes());
        v.extend_from_slice(&self.created.0.to_le_bytes());
        if let Some(p) = &self.pack {
            v.extend_from_slice(&p.pack.to_le_bytes());
            v.extend_from_slice(&p.offset.to_le_bytes());
        }
        v
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Self, StoreError> {
        let bad = || StoreError::Malformed("index entry");
        let mut r = Cursor(b);
        let version = r.u8().ok_or_else(bad)?;
        if version != 1 && version != 2 {
            return Err(bad());
        }
        let kind = ObjectKind::try_from(r.u8().ok_or_else(bad)?).map_err(|_| bad())?;
        let codec = r.u8().ok_or_else(bad)?;
        let has_base = r.u8().ok_or_else(bad)? != 0;
        let generation = r.u32().ok_or_else(bad)?;
        let base = if has_base {
            Some(r.id().ok_or_else(bad)?)
        } else {
            None
        };
        let depth = r.u32().ok_or_else(bad)?;
        let stored_len = r.u64().ok_or_else(bad)?;
        let content_len = r.u64().ok_or_else(bad)?;
        let created = Timestamp(r.u64().ok_or_else(bad)? as i64);
        let pack = match version {
            2 => Some(Packed {
                pack: r.u64().ok_or_else(bad)?,
                offset: r.u64().ok_or_else(bad)?,
            }),
            _ => None,
        };
        Ok(IndexEntry {
            kind,
            codec,
            generation,
            base,
            depth,
            stored_len,
            content_len,
            created,
            pack,
        })
    }
}

/// An object a retention rule deleted on purpose: commits still name it, and it is reported
/// as expired rather than missing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expired {
    /// Kind of the object.
    pub kind: ObjectKind,
    /// Size of its decoded data.
    pub content_len: u64,
    /// When it was deleted.
    pub time: Timestamp,
    /// The rule that deleted it (`retention.keep_last=5`).
    pub rule: String,
}

impl Expired {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = vec![1u8, self.kind as u8];
        v.extend_from_slice(&self.content_len.to_le_bytes());
        v.extend_from_slice(&self.time.0.to_le_bytes());
        v.extend_from_slice(self.rule.as_bytes());
        v
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Self, StoreError> {
        let bad = || StoreError::Malformed("expired entry");
        let mut r = Cursor(b);
        if r.u8().ok_or_else(bad)? != 1 {
            return Err(bad());
        }
        let kind = ObjectKind::try_from(r.u8().ok_or_else(bad)?).map_err(|_| bad())?;
        let content_len = r.u64().ok_or_else(bad)?;
        let time = Timestamp(r.u64().ok_or_else(bad)? as i64);
        let rule = String::from_utf8(r.0.to_vec()).map_err(|_| bad())?;
        Ok(Expired {
            kind,
            content_len,
            time,
            rule,
        })
    }
}

/// What the commit index keeps per commit, for history walks without reading records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitSummary {
    /// Commit time.
    pub time: Timestamp,
    /// The commit's manifest.
    pub manifest: ObjectId,
    /// Parent commits.
    pub parents: Vec<ObjectId>,
    /// Size of the checkpoint file.
    pub raw_bytes: u64,
}

impl CommitSummary {
    /// What the commit index keeps of `commit`.
    pub fn of(commit: &mdl_format::Commit) -> Self {
        CommitSummary {
            time: commit.time,
            manifest: commit.manifest,
            parents: commit.parents.clone(),
            raw_bytes: commit.stats.raw_bytes,
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = vec![1u8];
        v.extend_from_slice(&self.time.0.to_le_bytes());
        v.extend_from_slice(self.manifest.as_bytes());
        v.extend_from_slice(&self.raw_bytes.to_le_bytes());
        v.push(self.parents.len() as u8);
        for p in &self.parents {
            v.extend_from_slice(p.as_bytes());
        }
        v
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Self, StoreError> {
        let bad = || StoreError::Malformed("commit index entry");
        let mut r = Cursor(b);
        if r.u8().ok_or_else(bad)? != 1 {
            return Err(bad());
        }
        let time = Timestamp(r.u64().ok_or_else(bad)? as i64);
        let manifest = r.id().ok_or_else(bad)?;
        let raw_bytes = r.u64().ok_or_else(bad)?;
        let n = r.u8().ok_or_else(bad)?;
        let parents = (0..n)
            .map(|_| r.id().ok_or_else(bad))
            .collect::<Result<_, _>>()?;
        Ok(CommitSummary {
            time,
            manifest,
            parents,
            raw_bytes,
        })
    }
}

/// The value of a ref.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefValue {
    /// Points at a commit.
    Direct(ObjectId),
    /// Points at another ref (`HEAD → refs/heads/main`).
    Symbolic(String),
    /// An annotated tag: a commit plus who tagged it, when and why.
    Annotated {
        /// The tagged commit.
        target: ObjectId,
        /// Who made the tag.
        tagger: String,
        /// When.
        time: Timestamp,
        /// The tag message.
        message: String,
    },
}

impl RefValue {
    /// The commit this value points at directly, if any.
    pub fn target(&self) -> Option<ObjectId> {
        match self {
            RefValue::Direct(id) | RefValue::Annotated { target: id, .. } => Some(*id),
            RefValue::Symbolic(_) => None,
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        match self {
            RefValue::Direct(id) => [&[0u8][..], id.as_bytes()].concat(),
            RefValue::Symbolic(name) => [&[1u8][..], name.as_bytes()].concat(),
            RefValue::Annotated {
                target,
                tagger,
                time,
                message,
            } => {
                let mut v = vec![2u8];
                v.extend_from_slice(target.as_bytes());
                v.extend_from_slice(&time.0.to_le_bytes());
                v.extend_from_slice(&(tagger.len() as u32).to_le_bytes());
                v.extend_from_slice(tagger.as_bytes());
                v.extend_from_slice(message.as_bytes());
                v
            }
        }
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Self, StoreError> {
        let bad = || StoreError::Malformed("ref value");
        let mut r = Cursor(b);
        match r.u8().ok_or_else(bad)? {
            0 => Ok(RefValue::Direct(r.id().ok_or_else(bad)?)),
            1 => Ok(RefValue::Symbolic(
                String::from_utf8(r.0.to_vec()).map_err(|_| bad())?,
            )),
            2 => {
                let target = r.id().ok_or_else(bad)?;
                let time = Timestamp(r.u64().ok_or_else(bad)? as i64);
                let n = r.u32().ok_or_else(bad)? as usize;
                let tagger = r.take(n).ok_or_else(bad)?;
                let tagger = String::from_utf8(tagger.to_vec()).map_err(|_| bad())?;
                let message = String::from_utf8(r.0.to_vec()).map_err(|_| bad())?;
                Ok(RefValue::Annotated {
                    target,
                    tagger,
                    time,
                    message,
                })
            }
            _ => Err(bad()),
        }
    }
}

/// One change of a ref.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReflogEntry {
    /// Value before (None when the ref was created).
    pub old: Option<ObjectId>,
    /// Value after (None when the ref was deleted).
    pub new: Option<ObjectId>,
    /// When.
    pub time: Timestamp,
    /// What did it (`commit: step 1200`, `branch: created from main`).
    pub message: String,
}

impl ReflogEntry {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = vec![
            1u8,
            self.old.is_some() as u8 | (self.new.is_some() as u8) << 1,
        ];
        for id in self.old.iter().chain(self.new.iter()) {
            v.extend_from_slice(id.as_bytes());
        }
        v.extend_from_slice(&self.time.0.to_le_bytes());
        v.extend_from_slice(self.message.as_bytes());
        v
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Self, StoreError> {
        let bad = || StoreError::Malformed("reflog entry");
        let mut r = Cursor(b);
        if r.u8().ok_or_else(bad)? != 1 {
            return Err(bad());
        }
        let flags = r.u8().ok_or_else(bad)?;
        let old = if flags & 1 != 0 {
            Some(r.id().ok_or_else(bad)?)
        } else {
            None
        };
        let new = if flags & 2 != 0 {
            Some(r.id().ok_or_else(bad)?)
        } else {
            None
        };
        let time = Timestamp(r.u64().ok_or_else(bad)? as i64);
        let message = String::from_utf8(r.0.to_vec()).map_err(|_| bad())?;
        Ok(ReflogEntry {
            old,
            new,
            time,
            message,
        })
    }
}

/// Reads the encodings above (and the journal's entries): each read is `None` past the end.
pub(crate) struct Cursor<'a>(pub(crate) &'a [u8]);

impl<'a> Cursor<'a> {
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Some(h)
    }
    pub(crate) fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    pub(crate) fn id(&mut self) -> Option<ObjectId> {
        Some(ObjectId::from_bytes(self.take(32)?.try_into().ok()?))
    }
    /// A length (u32) and that many bytes.
    pub(crate) fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    /// [`Self::bytes`] as UTF-8.
    pub(crate) fn string(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_round_trip() {
        let e = IndexEntry {
            kind: ObjectKind::Tensor,
            codec: 1,
            generation: 3,
            base: Some(ObjectId::hash(b"b")),
            depth: 2,
            stored_len: 10,
            content_len: 20,
            created: Timestamp(1234),
            pack: None,
        };
        assert_eq!(IndexEntry::decode(&e.encode()).unwrap(), e);
        let e2 = IndexEntry { base: None, ..e };
        assert_eq!(IndexEntry::decode(&e2.encode()).unwrap(), e2);
        let packed = Some(Packed {
            pack: 0x0123_4567_89ab_cdef,
            offset: 1 << 33,
        });
        for e in [
            IndexEntry { pack: packed, ..e },
            IndexEntry { pack: packed, ..e2 },
        ] {
            assert_eq!(IndexEntry::decode(&e.encode()).unwrap(), e);
            let bytes = e.encode();
            assert!(IndexEntry::decode(&bytes[..bytes.len() - 1]).is_err());
        }
        let s = CommitSummary {
            time: Timestamp(5),
            manifest: ObjectId::hash(b"m"),
            parents: vec![ObjectId::hash(b"p")],
            raw_bytes: 9,
        };
        assert_eq!(CommitSummary::decode(&s.encode()).unwrap(), s);
        for v in [
            RefValue::Direct(ObjectId::hash(b"c")),
            RefValue::Symbolic("refs/heads/main".into()),
            RefValue::Annotated {
                target: ObjectId::hash(b"c"),
                tagger: "ada".into(),
                time: Timestamp(7),
                message: "release\nnotes".into(),
            },
        ] {
            assert_eq!(RefValue::decode(&v.encode()).unwrap(), v);
        }
        let r = ReflogEntry {
            old: None,
            new: Some(ObjectId::hash(b"n")),
            time: Timestamp(1),
            message: "m".into(),
        };
        assert_eq!(ReflogEntry::decode(&r.encode()).unwrap(), r);
    }
}
