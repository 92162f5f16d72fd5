//! The float codecs' passes over a tensor and another version of it: counting (what to store)
//! and encoding records, in memory or a window at a time. A commit uses them for its new
//! tensors; a deferred re-encode ([`super::deferred`]) for the previous versions it turns into
//! reverse deltas.

use std::collections::HashSet;
use std::io::{Seek, Write};
use std::sync::Mutex;

use mdl_codec::engine::Engine;
use mdl_codec::float::{self, Count};
use mdl_codec::planes::Transform;
use mdl_codec::CodecTag;
use mdl_format::ObjectId;
use mdl_store::{IndexEntry, ObjectBatch, Placement, Store};

use super::content::{pass, Content};
use crate::{Error, Repository, Result};

/// Re-encoding a previous version as a delta must save at least this fraction of its record.
pub(super) const REWRITE_GAIN_FLOOR: f64 = 0.02;

/// What the float passes share: the repository, the batch records go into, the kernels.
pub(super) struct Coder<'a> {
    pub(super) repo: &'a Repository,
    pub(super) batch: &'a ObjectBatch<'a>,
    pub(super) engine: &'a dyn Engine,
}

impl Coder<'_> {
    /// The float codecs' analysis of `data` (and against `base`): a pass counting its planes
    /// unless `plain` has them, and a pass counting the delta worth counting.
    pub(super) fn analyze(
        &self,
        id: ObjectId,
        dtype: mdl_format::Dtype,
        data: &Content<'_>,
        base: Option<&Content<'_>>,
        plain: Option<float::PlaneCount>,
    ) -> Result<float::Analysis> {
        let encoder = |source| Error::Encode { id, source };
        let width = dtype.size();
        let plain = match plain {
            Some(p) => p,
            None => {
                let mut c = float::PlaneCount::new(dtype, Count::Plain).map_err(encoder)?;
                pass(data, None, width, None, &mut |d, _| {
                    c.add(self.engine, d, None).map_err(encoder)
                })?;
                c
            }
        };
        let mut deltas: Option<Vec<float::PlaneCount>> = None;
        if let Some(base) = base {
            pass(data, Some(base), width, None, &mut |d, b| {
                let b = b.expect("a base window");
                let counts = match &mut deltas {
                    Some(c) => c,
                    None => deltas.insert(
                        float::deltas_to_count(self.engine, dtype, d, b)
                            .and_then(|kinds| {
                                kinds
                                    .into_iter()
                                    .map(|k| float::PlaneCount::new(dtype, k))
                                    .collect()
                            })
                            .map_err(encoder)?,
                    ),
                };
                counts
                    .iter_mut()
                    .try_for_each(|c| c.add(self.engine, d, Some(b)))
                    .map_err(encoder)
            })?;
        }
        Ok(float::analysis_of(&plain, &deltas.unwrap_or_default()))
    }

    /// Counts `data` against `base` in one pass, for the planes of `count`, and chooses.
    fn count(
        &self,
        id: ObjectId,
        dtype: mdl_format::Dtype,
        count: Count,
        data: &Content<'_>,
        base: &Content<'_>,
    ) -> Result<float::Choice> {
        let encoder = |source| Error::Encode { id, source };
        let mut c = float::PlaneCount::new(dtype, count).map_err(encoder)?;
        pass(data, Some(base), dtype.size(), None, &mut |d, b| {
            c.add(self.engine, d, b).map_err(encoder)
        })?;
        Ok(c.choice())
    }

    /// Encodes `data` (against `base`) as `choice` says and writes the record.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_float(
        &self,
        id: ObjectId,
        header: &mdl_format::TensorHeader,
        data: &Content<'_>,
        base: Option<&Content<'_>>,
        choice: &float::Choice,
        codec: CodecTag,
        placement: Placement,
    ) -> Result<IndexEntry> {
        let side = match base {
            Some(_) => Side::DataOnBase,
            None => Side::Data,
        };
        let record = FloatRecord {
            id,
            choice,
            codec,
            placement,
            side,
        };
        Ok(self.write_floats(header, data, base, &[record])?[0])
    }

    /// Encodes `records` in one pass over `data` and `base` and writes them. A tensor read a
    /// window at a time has each plane's chunks kept in a temporary file until the plane
    /// heads are known; the input, read again, must hash to the content id of what it encodes.
    pub(super) fn write_floats(
        &self,
        header: &mdl_format::TensorHeader,
        data: &Content<'_>,
        base: Option<&Content<'_>>,
        records: &[FloatRecord<'_>],
    ) -> Result<Vec<IndexEntry>> {
        let windowed = data.windowed() || base.is_some_and(Content::windowed);
        let mut writers = Vec::with_capacity(records.len());
        for r in records {
            let with_base = !matches!(r.side, Side::Data);
            let w = float::PayloadWriter::new(header.dtype, r.choice, with_base)
                .map_err(|source| Error::Encode { id: r.id, source })?;
            writers.push((w, Vec::<PlaneChunks>::new()));
        }
        // The input, on whichever side it is, is hashed again as it is encoded.
        let input = [Some(data), base]
            .into_iter()
            .flatten()
            .find_map(|c| match c {
                Content::Input { input, i, id } => Some((input.pieces[*i].header.hasher(), *id)),
                _ => None,
            });
        let (hasher, expected) = input.unzip();
        let read = pass(data, base, header.dtype.size(), hasher, &mut |d, b| {
            for (r, (writer, planes)) in records.iter().zip(&mut writers) {
                let (x, against) = match r.side {
                    Side::Data => (d, None),
                    Side::DataOnBase => (d, b),
                    Side::BaseOnData => (b.expect("a base"), Some(d)),
                };
                let coded = writer
                    .add(self.engine, x, against)
                    .map_err(|source| Error::Encode { id: r.id, source })?;
                if planes.is_empty() {
                    *planes = (0..coded.len())
                        .map(|_| PlaneChunks::new(self.repo.store(), windowed))
                        .collect::<Result<_>>()?;
                }
                planes
                    .iter_mut()
                    .zip(coded)
                    .try_for_each(|(p, chunks)| p.push(chunks))?;
            }
            Ok(())
        })?;
        if let (Some(read), Some(expected)) = (read, expected) {
            if read != expected {
                return Err(mdl_store::StoreError::InputChanged(expected).into());
            }
        }
        let mut entries = Vec::with_capacity(records.len());
        for (r, (writer, mut planes)) in records.iter().zip(writers) {
            let (head, heads) = writer.finish();
            let out = self
                .batch
                .put_written(&r.id, header, r.codec, r.placement, &mut |w| {
                    w.write_all(&head)?;
                    for (h, p) in heads.iter().zip(&mut planes) {
                        w.write_all(h)?;
                        p.copy_to(w)?;
                    }
                    Ok(())
                })?;
            entries.push(out.entry);
        }
        Ok(entries)
    }

    /// How to re-encode the previous version `prev` (already checked by [`Self::base_for`]) as a
    /// delta against the new tensor `data`, when that saves enough and no other tensor of this
    /// commit did (`None`: it stays as it is).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reverse_choice(
        &self,
        prev: &ObjectId,
        prev_entry: &IndexEntry,
        prev_data: &Content<'_>,
        data: &Content<'_>,
        dtype: mdl_format::Dtype,
        estimate: &float::Choice,
        rewritten: &Mutex<HashSet<ObjectId>>,
    ) -> Result<Option<float::Choice>> {
        if estimate.size as f64 > prev_entry.stored_len as f64 * (1.0 - REWRITE_GAIN_FLOOR)
            || !rewritten.lock().unwrap().insert(*prev)
        {
            return Ok(None);
        }
        // XOR planes are symmetric; planes taken as they are must be coded from the previous
        // version's own bytes unless they are stored raw.
        let choice = match estimate.transform {
            Transform::Planes if estimate.reusable_for_swap() => estimate.clone(),
            Transform::Planes => self.count(
                *prev,
                dtype,
                Count::Masked(estimate.xor_mask),
                prev_data,
                data,
            )?,
            // The difference changes sign with the roles, and its zigzag symbols with it.
            Transform::Sub => self.count(*prev, dtype, Count::Sub, prev_data, data)?,
        };
        let pays = choice.size as f64 <= prev_entry.stored_len as f64 * (1.0 - REWRITE_GAIN_FLOOR);
        Ok(pays.then_some(choice))
    }
}

/// A float record written by [`Coder::write_floats`].
pub(super) struct FloatRecord<'c> {
    pub(super) id: ObjectId,
    pub(super) choice: &'c float::Choice,
    pub(super) codec: CodecTag,
    pub(super) placement: Placement,
    pub(super) side: Side,
}

/// What a [`FloatRecord`] encodes, of a pass over a tensor (`data`) and another version of it
/// (`base`).
#[derive(Clone, Copy)]
pub(super) enum Side {
    /// `data` alone.
    Data,
    /// `data` as a delta against `base`.
    DataOnBase,
    /// `base` as a delta against `data` (a reverse re-encode).
    BaseOnData,
}

/// One plane's coded chunks while a payload is encoded: in memory, or (for a tensor read a
/// window at a time) in an unnamed temporary file beside the store, gone when dropped.
enum PlaneChunks {
    Memory(Vec<Vec<u8>>),
    File(std::io::BufWriter<std::fs::File>),
}

impl PlaneChunks {
    fn new(store: &Store, spill: bool) -> Result<PlaneChunks> {
        if !spill {
            return Ok(PlaneChunks::Memory(Vec::new()));
        }
        let file = store.spill_file()?;
        Ok(PlaneChunks::File(std::io::BufWriter::with_capacity(
            1 << 20,
            file,
        )))
    }

    fn push(&mut self, chunks: Vec<Vec<u8>>) -> Result<()> {
        match self {
            PlaneChunks::Memory(v) => v.extend(chunks),
            PlaneChunks::File(f) => {
                for c in chunks {
                    f.write_all(&c)
                        .map_err(|e| Error::Store(mdl_store::StoreError::Output(e)))?;
                }
            }
        }
        Ok(())
    }

    /// Writes the chunks, in order, to `w`.
    fn copy_to(&mut self, w: &mut dyn Write) -> std::io::Result<()> {
        match self {
            PlaneChunks::Memory(v) => v.iter().try_for_each(|c| w.write_all(c)),
            PlaneChunks::File(f) => {
                f.flush()?;
                let file = f.get_mut();
                file.seek(std::io::SeekFrom::Start(0))?;
                std::io::copy(file, w).map(drop)
            }
        }
    }
}
