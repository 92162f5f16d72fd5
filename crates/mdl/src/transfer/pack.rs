//! Writing a pack stream (`docs/FORMAT.md`) from stored records; `receive.rs` reads one.

use std::collections::HashMap;
use std::io::Write;

use mdl_codec::CodecTag;
use mdl_format::record::{self, RecordHeader};
use mdl_format::{ObjectId, ObjectKind};
use mdl_protocol::body::Resume;
use mdl_store::{Expired, IndexEntry, StoreError};

use rayon::prelude::*;

use super::derived::{self, Derived};
use super::toc::{Frame, FrameRecord};
use super::PACK_MAGIC;
use crate::{Error, Repository, Result};

/// Frame length that marks an expired tensor instead of a record (see [`write_pack`]).
pub(super) const EXPIRED_FRAME: u64 = u64::MAX;

/// Frame length that marks a record sent from an offset: what the receiver asked to go on
/// from ([`Resume`]); then the offset and the whole record's length (u64 LE each), then the
/// record's bytes from that offset.
pub(super) const RESUMED_FRAME: u64 = u64::MAX - 1;

/// Longest retention rule an expired frame may carry.
pub(super) const MAX_RULE_LEN: usize = 1024;

/// Writes the records of `ids`, in that order, as a pack stream. Returns the bytes written.
/// A tensor that retention deleted goes as an expired frame (its length field
/// [`EXPIRED_FRAME`], then what the receiver records about it), so a thinned commit travels
/// thinned.
#[tracing::instrument(name = "transfer.write_pack", skip_all, fields(objects = ids.len()))]
pub fn write_pack(repo: &Repository, ids: &[ObjectId], w: &mut dyn Write) -> Result<u64> {
    Ok(write_frames(repo, ids, w)?.0)
}

/// [`write_pack`], with each tensor that `against` pairs with a tensor the receiver holds sent
/// as a record coded against it where that is smaller ([`super::derived_record`]), and the
/// record `resume` names sent from where the receiver was cut off, if it starts with the bytes
/// the receiver holds (a [`RESUMED_FRAME`]; else whole).
pub fn write_pack_against(
    repo: &Repository,
    ids: &[ObjectId],
    against: &HashMap<ObjectId, ObjectId>,
    resume: Option<&Resume>,
    w: &mut dyn Write,
) -> Result<u64> {
    let mut pack = PackWriter::new(w)?;
    pack.resume = resume.copied();
    pack.objects_against(repo, ids, against)?;
    Ok(pack.finish()?.0)
}

/// [`write_pack`], returning the bytes written and where each frame is ([`Frame`]).
pub(super) fn write_frames(
    repo: &Repository,
    ids: &[ObjectId],
    w: &mut dyn Write,
) -> Result<(u64, Vec<Frame>)> {
    let mut pack = PackWriter::new(w)?;
    pack.objects(repo, ids)?;
    pack.finish()
}

/// The record of `id` as a receiver accepts it, with its codec. A manifest or commit that an
/// earlier mdl wrote compressed beyond what a record may claim to expand to
/// ([`record::check_content_len`]) goes raw instead: its id names its content, not its bytes,
/// so the history that holds it still travels.
fn sendable_record(
    repo: &Repository,
    id: &ObjectId,
    entry: &IndexEntry,
) -> Result<(Vec<u8>, IndexEntry)> {
    let (stored, entry) = repo.store().read_current_record(id, entry)?;
    if entry.kind == ObjectKind::Tensor {
        return Ok((stored, entry));
    }
    // `read_record` verified the record; only its header's length is needed here.
    let (header, hlen) = RecordHeader::decode(&stored).map_err(|source| StoreError::Corrupt {
        id: *id,
        kind: entry.kind.name(),
        source,
    })?;
    let payload_len = (stored.len() - hlen - record::TRAILER_LEN) as u64;
    if record::check_content_len(&header, payload_len, entry.content_len).is_ok() {
        return Ok((stored, entry));
    }
    let content = repo.store().read_object_vec(id)?;
    let raw = RecordHeader::new(entry.kind, CodecTag::Raw as u8, None, Vec::new());
    let entry = IndexEntry {
        codec: CodecTag::Raw as u8,
        base: None,
        ..entry
    };
    Ok((record::encode(&raw, &content, content.len() as u64), entry))
}

/// A pack stream being written: the frames of a list of objects ([`Self::objects`]), then its
/// end ([`Self::finish`], or [`Self::finish_with_toc`]).
pub struct PackWriter<'w> {
    w: &'w mut dyn Write,
    /// Bytes written so far.
    total: u64,
    frames: Vec<Frame>,
    /// The record the receiver holds the start of, until it is written.
    resume: Option<Resume>,
}

fn out(e: std::io::Error) -> Error {
    Error::from(StoreError::Output(e))
}

impl<'w> PackWriter<'w> {
    /// Starts a pack on `w`.
    pub fn new(w: &'w mut dyn Write) -> Result<PackWriter<'w>> {
        w.write_all(PACK_MAGIC).map_err(out)?;
        Ok(PackWriter {
            w,
            total: PACK_MAGIC.len() as u64,
            frames: Vec::new(),
            resume: None,
        })
    }

    /// Adds the record of `id` that `entry` indexes, or `derived`, one coded against a tensor
    /// the receiver holds.
    fn record(
        &mut self,
        repo: &Repository,
        id: &ObjectId,
        entry: &IndexEntry,
        derived: Option<Derived>,
    ) -> Result<()> {
        let (record, codec, base) = match derived {
            Some(d) => (d.record, d.codec, Some(d.base)),
            None => {
                let (record, current) = sendable_record(repo, id, entry)?;
                (record, current.codec, current.base)
            }
        };
        let info = FrameRecord {
            kind: entry.kind,
            codec,
            base,
            content_len: entry.content_len,
        };
        if let Some(held) = self.resumable(id, &record) {
            let at = [held.to_le_bytes(), (record.len() as u64).to_le_bytes()].concat();
            let rest = &record[held as usize..];
            return self.frame(id, &RESUMED_FRAME.to_le_bytes(), &[&at, rest], Some(info));
        }
        let len = (record.len() as u64).to_le_bytes();
        self.frame(id, &len, &[&record], Some(info))
    }

    /// Where the record of `id` may be sent from: the receiver holds its first bytes.
    fn resumable(&mut self, id: &ObjectId, record: &[u8]) -> Option<u64> {
        let r = self.resume.take_if(|r| r.id == *id)?;
        let held = usize::try_from(r.held).ok()?;
        let fits = r.len == record.len() as u64 && held < record.len();
        let same = fits && ObjectId::hash(&record[..held]) == r.digest;
        tracing::debug!(%id, held, same, "asked to resume a record");
        same.then_some(r.held)
    }

    /// Adds the records of `ids`, in that order, from the index. A tensor that retention
    /// deleted goes as an expired frame (its length field [`EXPIRED_FRAME`], then what the
    /// receiver records about it), so a thinned commit travels thinned.
    pub fn objects(&mut self, repo: &Repository, ids: &[ObjectId]) -> Result<()> {
        self.objects_against(repo, ids, &HashMap::new())
    }

    /// [`Self::objects`], each tensor that `against` pairs with one the receiver holds coded
    /// against it where that is smaller.
    pub fn objects_against(
        &mut self,
        repo: &Repository,
        ids: &[ObjectId],
        against: &HashMap<ObjectId, ObjectId>,
    ) -> Result<()> {
        enum Item {
            Record(IndexEntry),
            Expired(Expired),
        }
        // A tensor's record and the version of it the receiver holds, where paired.
        fn paired<'i>(
            item: &'i Item,
            base: Option<&ObjectId>,
        ) -> Option<(&'i IndexEntry, ObjectId)> {
            match (item, base) {
                (Item::Record(e), Some(base)) => Some((e, *base)),
                _ => None,
            }
        }
        let items = {
            let meta = repo.store().meta().read()?;
            ids.iter()
                .map(|id| match meta.object(id)? {
                    Some(e) => Ok(Item::Record(e)),
                    None => meta
                        .expired(id)?
                        .map(Item::Expired)
                        .ok_or(StoreError::Missing(*id)),
                })
                .collect::<Result<Vec<_>, _>>()?
        };
        // Records coded against what the receiver holds are made a window of tensors at a
        // time, in parallel, under one reservation of the decode budget (taken here, on the
        // writer's thread: the workers never wait for it), and written in order.
        let window = rayon::current_num_threads().max(1);
        for (ids, items) in ids.chunks(window).zip(items.chunks(window)) {
            let made = match ids.iter().any(|id| against.contains_key(id)) {
                // A window of records as stored (a push, a clone) goes straight out.
                false => ids.iter().map(|_| None).collect(),
                true => {
                    let held = (ids.iter().zip(items))
                        .filter_map(|(id, item)| paired(item, against.get(id)))
                        .map(|(e, _)| derived::held_bytes(e))
                        .sum();
                    // The pairs claimed first, holding nothing: a writer waiting for another's
                    // records must not hold budget that the other's making needs.
                    let pairs: Vec<(ObjectId, ObjectId)> = (ids.iter().zip(items))
                        .filter_map(|(id, item)| Some((*id, paired(item, against.get(id))?.1)))
                        .collect();
                    let _claim = derived::Claim::take(&pairs);
                    let _budget = crate::budget::reserve(held);
                    (ids.par_iter().zip(items))
                        .map(|(id, item)| match paired(item, against.get(id)) {
                            Some((e, base)) => derived::derived(repo, id, e, &base),
                            None => Ok(None),
                        })
                        .collect::<Result<Vec<_>>>()?
                }
            };
            for ((id, item), derived) in ids.iter().zip(items).zip(made) {
                match item {
                    Item::Record(entry) => self.record(repo, id, entry, derived)?,
                    Item::Expired(x) => {
                        let rule = &x.rule.as_bytes()[..x.rule.len().min(MAX_RULE_LEN)];
                        let mut b = vec![x.kind as u8];
                        b.extend_from_slice(&x.content_len.to_le_bytes());
                        b.extend_from_slice(&x.time.0.to_le_bytes());
                        b.extend_from_slice(&(rule.len() as u16).to_le_bytes());
                        b.extend_from_slice(rule);
                        self.frame(id, &EXPIRED_FRAME.to_le_bytes(), &[&b], None)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes a frame: `id`, its length field, and its body (`parts`, in order).
    fn frame(
        &mut self,
        id: &ObjectId,
        len_field: &[u8; 8],
        parts: &[&[u8]],
        record: Option<FrameRecord>,
    ) -> Result<()> {
        self.w.write_all(id.as_bytes()).map_err(out)?;
        self.w.write_all(len_field).map_err(out)?;
        let mut len = 0;
        for part in parts {
            self.w.write_all(part).map_err(out)?;
            len += part.len() as u64;
        }
        self.frames.push(Frame {
            id: *id,
            offset: self.total + 40,
            len,
            record,
        });
        self.total += 40 + len;
        Ok(())
    }

    /// Writes the end frame: the stream's length and its frames.
    pub fn finish(mut self) -> Result<(u64, Vec<Frame>)> {
        let len = self.end()?;
        Ok((len, self.frames))
    }

    /// [`Self::finish`], then the table of contents after the end frame (for a reader that
    /// reads only some of the records): the length of all of it, and the frames.
    pub fn finish_with_toc(mut self) -> Result<(u64, Vec<Frame>)> {
        let len = self.end()?;
        let toc = super::encode_toc(&self.frames, len);
        self.w.write_all(&toc).map_err(out)?;
        Ok((len + toc.len() as u64, self.frames))
    }

    /// Writes the end frame; the stream's length.
    fn end(&mut self) -> Result<u64> {
        self.w.write_all(&[0u8; 40]).map_err(out)?;
        Ok(self.total + 40)
    }
}
