//! New tensor content stored exactly: raw or zstd where the float codecs do not pay, else a
//! self-contained float record, or a delta against the previous version — forward (the new
//! version refers to the old) or reverse (the old version re-encoded against the new).

use std::sync::atomic::Ordering;

use mdl_codec::engine::Kept;
use mdl_codec::{float, CodecTag, SMALL_TENSOR};
use mdl_format::ObjectId;
use mdl_store::{IndexEntry, Placement};

use super::content::Content;
use super::reverse::Reverse;
use super::{delta_codec, floats_pay, is_delta_candidate, previous_content, StoreCtx, Stored};
use crate::policy::DeltaMode;
use crate::rewrite::Rewrite;
use crate::{Error, Result};

/// What a self-contained record of new content is made from.
struct Whole<'w> {
    id: ObjectId,
    /// The piece of the input.
    i: usize,
    data: &'w Content<'w>,
    /// The content's planes, where it was split already (in memory, no delta made of it).
    planes: Option<&'w [Vec<u8>]>,
    /// Its float-split payload, where it was coded already (with others, on a device).
    encoded: Option<&'w float::Encoded>,
    analysis: &'w float::Analysis,
    /// Bytes the analysis' sizes are of.
    len: u64,
    /// The codec of a self-contained float record.
    codec: CodecTag,
}

/// What was made of new content before its turn: its float-split count (a large tensor's,
/// or one made with others on a device), and with it the float-split payload where that pays.
#[derive(Default)]
pub(super) struct Counted {
    pub(super) plain: Option<float::PlaneCount>,
    pub(super) encoded: Option<float::Encoded>,
}

/// The previous version a delta is made against: its id, its entry, its content, and the
/// analysis' best delta against it.
struct Base<'b> {
    id: ObjectId,
    entry: IndexEntry,
    content: Content<'b>,
    delta: &'b float::Choice,
}

impl StoreCtx<'_> {
    /// Stores new tensor content with the lossless codecs; `whole_codec` is the codec of
    /// a self-contained float record (float-split, or mantissa-trim for trimmed content).
    /// `data` is in memory, or the input read a window at a time (a large tensor: its
    /// previous version is then decoded a window at a time too); `counted` is what the caller
    /// already made of it.
    pub(super) fn encode_new(
        &self,
        id: ObjectId,
        i: usize,
        data: Content<'_>,
        whole_codec: CodecTag,
        counted: Counted,
    ) -> Result<Stored> {
        let Counted { plain, encoded } = counted;
        let info = &self.input.pieces[i];
        if !is_delta_candidate(info) {
            return Ok(new_record(id, self.streamed(id, i, &data)?));
        }
        let store = self.repo.store();
        let base = self.delta_base(i, &id)?;
        // A tensor in memory takes its base into memory (from the warm cache when it is
        // there); one read a window at a time reads its base so too.
        let base_kept = match (&base, data.windowed()) {
            (Some((bid, be)), false) => Some(previous_content(store, self.warm, bid, be)?),
            _ => None,
        };
        let base_content = match (&base, &base_kept) {
            (_, Some(kept)) => Some(Content::Memory(kept)),
            (Some((bid, be)), None) => Some(Content::Stored {
                store,
                id: *bid,
                entry: *be,
            }),
            (None, _) => None,
        };
        // A forward delta where few elements changed: the mask and the changed elements, made
        // from one comparing pass; when that is clearly small, nothing else is counted.
        let masked = match (self.policy.mode, &data, &base_content) {
            (DeltaMode::Forward, Content::Memory(d), Some(Content::Memory(b))) => {
                float::encode_masked(info.header.dtype, d, b)
                    .map_err(|source| Error::Encode { id, source })?
            }
            _ => None,
        };
        if let (Some(m), Some((base_id, entry))) = (&masked, &base) {
            if m.payload.len() < data.len() / float::MASKED_AT_ONCE {
                return self.write_masked(id, i, m, base_id, entry);
            }
        }
        let _kept = self.keep_on_engine(&data, base_content.as_ref());
        // The bytes the analysis' sizes are of: the tensor's, or the first window's of a large
        // tensor that no delta is made of now.
        let len = plain
            .as_ref()
            .map_or(data.len() as u64, float::PlaneCount::counted_bytes);
        // Only a forward delta is counted with the new tensor; with reverse deltas it is stored
        // whole whatever its base, and the base re-encoded against it in a pass of its own.
        let forward_base = match self.policy.mode {
            DeltaMode::Forward => base_content.as_ref(),
            DeltaMode::Off | DeltaMode::Reverse => None,
        };
        // A tensor in memory that no delta is made of is split into its planes once, for its
        // counts and its codes (on the host: a device counts and codes where it holds them).
        let split = match (&data, forward_base, &plain) {
            (Content::Memory(d), None, None) if self.coder.engine.splits_on_host(d) => {
                let mut planes = self.spare_planes.take();
                let count = self
                    .coder
                    .split_counted(id, info.header.dtype, d, &mut planes)?;
                Some((count, planes))
            }
            _ => None,
        };
        let analysis = match &split {
            Some((count, _)) => float::analysis_of(count, &[]),
            None => self
                .coder
                .analyze(id, info.header.dtype, &data, forward_base, plain)?,
        };
        let delta = analysis.best_delta();
        let best_float = delta.map_or(analysis.plain.size, |d| d.size);
        let whole = Whole {
            id,
            i,
            data: &data,
            planes: split.as_ref().map(|(_, planes)| &planes[..]),
            encoded: encoded.as_ref(),
            analysis: &analysis,
            len,
            codec: whole_codec,
        };
        // Where the float codecs barely help (noise-like or repetitive data), raw and zstd
        // compete instead.
        let floats_pay = floats_pay(best_float, len);
        let (Some((base_id, entry)), Some(content)) = (base, base_content) else {
            return Ok(new_record(id, self.write_whole(&whole, floats_pay)?));
        };
        if let Some(m) = masked.filter(|m| {
            (m.payload.len() as u64) < delta.map_or(analysis.plain.size, |d| d.size) && floats_pay
        }) {
            return self.write_masked(id, i, &m, &base_id, &entry);
        }
        match (self.policy.mode, delta) {
            (DeltaMode::Forward, Some(delta)) if floats_pay => {
                let base = Base {
                    id: base_id,
                    entry,
                    content,
                    delta,
                };
                self.write_forward(&whole, &base)
            }
            (DeltaMode::Reverse, _) => {
                let entry_new = self.write_whole(&whole, floats_pay)?;
                let reverse = Reverse {
                    prev: base_id,
                    prev_entry: entry,
                    prev_data: &content,
                    new: id,
                    new_depth: 0,
                    data: &data,
                };
                let rewrite = match self.rewritten.lock().unwrap().insert(base_id) {
                    true => self.coder.write_reverse(&info.header, &reverse)?,
                    false => None,
                };
                Ok(Stored {
                    id,
                    added: Some((id, entry_new)),
                    rewrite: rewrite.map(|new| {
                        Box::new(Rewrite {
                            id: base_id,
                            old: entry,
                            new,
                        })
                    }),
                })
            }
            _ => Ok(new_record(id, self.write_whole(&whole, floats_pay)?)),
        }
    }

    /// Raw or zstd, streamed from wherever the bytes are (and hashed as they are encoded).
    fn streamed(&self, id: ObjectId, i: usize, data: &Content<'_>) -> Result<IndexEntry> {
        let bytes = match data {
            Content::Memory(b) => b,
            Content::Input { input, i, .. } => input.tensor(*i),
            Content::Stored { .. } => unreachable!("new content is never a stored object"),
        };
        let header = &self.input.pieces[i].header;
        Ok(self
            .coder
            .batch
            .put_tensor(&id, header, bytes, self.encode)?
            .entry)
    }

    /// The previous version a delta of piece `i` is made against. With deferred reverse
    /// deltas there is none now: the new version is stored whole, and the previous one is
    /// re-encoded against it after the publish ([`crate::commit::run_deferred`]).
    pub(super) fn delta_base(
        &self,
        i: usize,
        id: &ObjectId,
    ) -> Result<Option<(ObjectId, IndexEntry)>> {
        let base = self.base_for(i, id, false)?;
        if base.is_some() && self.policy.mode == DeltaMode::Reverse && self.policy.defer {
            self.deferred.store(true, Ordering::Relaxed);
            return Ok(None);
        }
        Ok(base)
    }

    /// Analysis, encoding and a reverse re-encode all read the content and its base: a GPU
    /// engine copies each over once, for as long as the result is held.
    fn keep_on_engine<'k>(
        &'k self,
        data: &Content<'k>,
        base: Option<&Content<'k>>,
    ) -> (Kept<'k>, Option<Kept<'k>>) {
        let engine = self.coder.engine;
        match (data, base) {
            (Content::Memory(d), b) => (
                engine.keep(d),
                match b {
                    Some(Content::Memory(b)) => Some(engine.keep(b)),
                    _ => None,
                },
            ),
            _ => (Kept::nothing(), None),
        }
    }

    /// The best self-contained record: float-split unless it would not beat raw, or raw and
    /// zstd where the float codecs barely help (`!floats_pay`).
    fn write_whole(&self, w: &Whole<'_>, floats_pay: bool) -> Result<IndexEntry> {
        if !floats_pay || w.analysis.plain.size >= w.len || w.len < SMALL_TENSOR {
            return self.streamed(w.id, w.i, w.data);
        }
        let header = &self.input.pieces[w.i].header;
        if let Some(encoded) = w.encoded {
            let pieces = encoded.pieces();
            let put = self.coder.batch.put_payload(
                &w.id,
                header,
                w.codec,
                Placement::default(),
                &pieces,
            )?;
            return Ok(put.entry);
        }
        match w.planes {
            Some(planes) => {
                self.coder
                    .write_split(w.id, header, planes, &w.analysis.plain, w.codec)
            }
            None => self.coder.write_float(
                w.id,
                header,
                w.data,
                None,
                &w.analysis.plain,
                w.codec,
                Placement::default(),
            ),
        }
    }

    /// The new version as a masked delta against `base` (its id and entry), one step further
    /// down its chain.
    pub(super) fn write_masked(
        &self,
        id: ObjectId,
        i: usize,
        m: &float::DeltaPayload,
        base: &ObjectId,
        entry: &IndexEntry,
    ) -> Result<Stored> {
        let placement = Placement {
            generation: 0,
            base: Some(*base),
            depth: entry.depth + 1,
        };
        let header = &self.input.pieces[i].header;
        let codec = CodecTag::delta(m.transform);
        let put = (self.coder.batch).put_payload(&id, header, codec, placement, &[&m.payload])?;
        Ok(new_record(id, put.entry))
    }

    /// The new version as a delta against `base`, one step further down its chain.
    fn write_forward(&self, w: &Whole<'_>, base: &Base<'_>) -> Result<Stored> {
        let placement = Placement {
            generation: 0,
            base: Some(base.id),
            depth: base.entry.depth + 1,
        };
        let entry = self.coder.write_float(
            w.id,
            &self.input.pieces[w.i].header,
            w.data,
            Some(&base.content),
            base.delta,
            delta_codec(base.delta),
            placement,
        )?;
        Ok(new_record(w.id, entry))
    }
}

/// A tensor stored as a new record of its own.
fn new_record(id: ObjectId, entry: IndexEntry) -> Stored {
    Stored {
        id,
        added: Some((id, entry)),
        rewrite: None,
    }
}
