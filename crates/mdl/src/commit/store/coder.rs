//! The float codecs' passes over a tensor and another version of it: counting (what to store)
//! and encoding records, in memory or a window at a time. A commit uses them for its new
//! tensors; a reverse re-encode (`reverse.rs`) for the previous versions it turns into deltas.

use std::io::Write;

use mdl_codec::engine::Engine;
use mdl_codec::float::{self, Count};
use mdl_codec::CodecTag;
use mdl_format::ObjectId;
use mdl_store::{IndexEntry, ObjectBatch, Placement};

use super::content::{pass, Content};
use crate::{Error, Repository, Result, BIG_TENSOR};

/// What the float passes share: the repository, the batch records go into, the kernels.
pub(in crate::commit) struct Coder<'a> {
    pub(in crate::commit) repo: &'a Repository,
    pub(in crate::commit) batch: &'a ObjectBatch<'a>,
    pub(in crate::commit) engine: &'a dyn Engine,
}

impl<'a> Coder<'a> {
    /// The float codecs' analysis of `data` (and against `base`): one pass counting its planes
    /// (unless `plain` has them) and the delta worth counting.
    pub(in crate::commit) fn analyze(
        &self,
        id: ObjectId,
        dtype: mdl_format::Dtype,
        data: &Content<'_>,
        base: Option<&Content<'_>>,
        plain: Option<float::PlaneCount>,
    ) -> Result<float::Analysis> {
        let encoder = |source| Error::Encode { id, source };
        let counted = plain.is_some();
        let mut plain = match plain {
            Some(p) => p,
            None => float::PlaneCount::new(dtype, Count::Plain).map_err(encoder)?,
        };
        let mut deltas: Option<Vec<float::PlaneCount>> = None;
        if counted && base.is_none() {
            return Ok(float::analysis_of(&plain, &[]));
        }
        // Counts add exactly, so counting the plain planes in the delta's pass (a tensor read
        // a window at a time is decoded once less) changes nothing.
        pass(data, base, dtype.size(), None, &mut |d, b| {
            if !counted {
                plain.add(self.engine, d, None).map_err(encoder)?;
            }
            let Some(b) = b else {
                return Ok(());
            };
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
        Ok(float::analysis_of(&plain, &deltas.unwrap_or_default()))
    }

    /// Splits `data`, a tensor in memory stored whole (no delta is made of it now), into
    /// `planes` once, and counts its planes from them (the counts [`Self::analyze`] makes);
    /// [`Self::write_split`] codes the record from the same planes.
    pub(in crate::commit) fn split_counted(
        &self,
        id: ObjectId,
        dtype: mdl_format::Dtype,
        data: &[u8],
        planes: &mut Vec<Vec<u8>>,
    ) -> Result<float::PlaneCount> {
        let encoder = |source| Error::Encode { id, source };
        let mut count = float::PlaneCount::new(dtype, Count::Plain).map_err(encoder)?;
        count
            .add_splitting(self.engine, data, None, planes)
            .map_err(encoder)?;
        Ok(count)
    }

    /// Writes the self-contained record of a tensor split by [`Self::split_counted`], coded as
    /// `choice` says from its `planes`.
    pub(in crate::commit) fn write_split(
        &self,
        id: ObjectId,
        header: &mdl_format::TensorHeader,
        planes: &[Vec<u8>],
        choice: &float::Choice,
        codec: CodecTag,
    ) -> Result<IndexEntry> {
        let encoded = float::encode_split(self.engine, header.dtype, planes, false, choice)
            .map_err(|source| Error::Encode { id, source })?;
        Ok(self
            .batch
            .put_payload(&id, header, codec, Placement::default(), &encoded.pieces())?
            .entry)
    }

    /// Encodes `data` (against `base`) as `choice` says and writes the record.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::commit) fn write_float(
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

    /// Encodes `records` in one pass over `data` and `base` and writes them. A tensor of
    /// [`BIG_TENSOR`] bytes or more is written framed, each frame as soon as it is encoded
    /// (so one read a window at a time is never held); the input, read again, must hash to the
    /// content id of what it encodes.
    pub(in crate::commit) fn write_floats(
        &self,
        header: &mdl_format::TensorHeader,
        data: &Content<'_>,
        base: Option<&Content<'_>>,
        records: &[FloatRecord<'_>],
    ) -> Result<Vec<IndexEntry>> {
        let framed = data.len() as u64 >= BIG_TENSOR;
        let windowed = data.windowed() || base.is_some_and(Content::windowed);
        debug_assert!(
            framed || !windowed,
            "a tensor read a window at a time is framed"
        );
        let mut writers = Vec::with_capacity(records.len());
        for r in records {
            let with_base = !matches!(r.side, Side::Data);
            writers.push(if framed {
                let out = self
                    .batch
                    .open_written(&r.id, header, r.codec, r.placement)?;
                Writer::framed(r.id, header, r.choice, with_base, out)?
            } else {
                let payload = float::PayloadWriter::new(header.dtype, r.choice, with_base)
                    .map_err(|source| Error::Encode { id: r.id, source })?;
                Writer::Whole {
                    payload,
                    planes: Vec::new(),
                }
            });
        }
        // The input, on whichever side it is, is hashed again as it is encoded.
        let expected = [Some(data), base]
            .into_iter()
            .flatten()
            .find_map(|c| match c {
                Content::Input { id, .. } => Some(*id),
                _ => None,
            });
        let read = self.encode(header, data, base, records, &mut writers)?;
        if let (Some(read), Some(expected)) = (read, expected) {
            if read != expected {
                return Err(mdl_store::StoreError::InputChanged(expected).into());
            }
        }
        let mut entries = Vec::with_capacity(records.len());
        for (r, writer) in records.iter().zip(writers) {
            let out = match writer {
                Writer::Framed { out, .. } => out.finish()?,
                Writer::Whole { payload, planes } => {
                    let (head, heads) = payload.finish();
                    let mut pieces: Vec<&[u8]> = vec![&head];
                    for (h, chunks) in heads.iter().zip(&planes) {
                        pieces.push(h);
                        pieces.extend(chunks.iter().map(Vec::as_slice));
                    }
                    self.batch
                        .put_payload(&r.id, header, r.codec, r.placement, &pieces)?
                }
            };
            entries.push(out.entry);
        }
        Ok(entries)
    }

    /// Encodes `data`, the input read a window at a time (a large tensor, stored whole as
    /// `choice` says), in one pass that also hashes it: returns its id, and its record, framed,
    /// not named yet — named by the caller ([`mdl_store::RecordWriter::finish_as`]), or
    /// dropped if the store has the object already.
    pub(in crate::commit) fn write_unnamed<'b>(
        &'b self,
        header: &mdl_format::TensorHeader,
        data: &Content<'_>,
        choice: &float::Choice,
    ) -> Result<(ObjectId, mdl_store::RecordWriter<'b, 'a>)> {
        let unknown = ObjectId::from_bytes([0; 32]);
        let out = self
            .batch
            .open_unnamed(header, CodecTag::FloatSplit, Placement::default())?;
        let mut writers = vec![Writer::framed(unknown, header, choice, false, out)?];
        let record = FloatRecord {
            id: unknown,
            choice,
            codec: CodecTag::FloatSplit,
            placement: Placement::default(),
            side: Side::Data,
        };
        let id = self
            .encode(header, data, None, &[record], &mut writers)?
            .expect("the input is hashed");
        match writers.pop() {
            Some(Writer::Framed { out, .. }) => Ok((id, out)),
            _ => unreachable!("one framed writer"),
        }
    }

    /// The pass of [`Self::write_floats`]: each window of `data` and `base` into each record's
    /// writer (framed records' frames written by a thread of their own while the next window
    /// is encoded). Returns the hash of the input's bytes read, if it is on either side.
    fn encode(
        &self,
        header: &mdl_format::TensorHeader,
        data: &Content<'_>,
        base: Option<&Content<'_>>,
        records: &[FloatRecord<'_>],
        writers: &mut [Writer<'_, '_>],
    ) -> Result<Option<ObjectId>> {
        let hasher = [Some(data), base]
            .into_iter()
            .flatten()
            .find_map(|c| match c {
                Content::Input { input, i, .. } => Some(input.pieces[*i].header.hasher()),
                _ => None,
            });
        // Each writer taken apart: what the pass encodes with, and where framed records go.
        let mut coders = Vec::with_capacity(writers.len());
        let mut outs = Vec::new();
        for w in writers.iter_mut() {
            match w {
                Writer::Framed { frames, out } => {
                    coders.push(Coding::Frames(frames, outs.len()));
                    outs.push(out);
                }
                Writer::Whole { payload, planes } => coders.push(Coding::Whole(payload, planes)),
            }
        }
        // A frame is handed to the writer when it takes it: one is written while the next is
        // encoded (a writer thread only where there are frames to write).
        let (tx, rx) = std::sync::mpsc::sync_channel::<(usize, float::Encoded)>(0);
        std::thread::scope(|s| {
            let written = (!outs.is_empty()).then(|| {
                s.spawn(move || -> std::io::Result<()> {
                    for (k, frame) in rx {
                        frame
                            .pieces()
                            .iter()
                            .try_for_each(|p| outs[k].write_all(p))?;
                    }
                    Ok(())
                })
            });
            let read = pass(data, base, header.dtype.size(), hasher, &mut |d, b| {
                for (r, coding) in records.iter().zip(coders.iter_mut()) {
                    let (x, against) = match r.side {
                        Side::Data => (d, None),
                        Side::DataOnBase => (d, b),
                        Side::BaseOnData => (b.expect("a base"), Some(d)),
                    };
                    let encoder = |source| Error::Encode { id: r.id, source };
                    match coding {
                        Coding::Frames(frames, k) => {
                            for frame in frames.encode(self.engine, x, against).map_err(encoder)? {
                                if tx.send((*k, frame)).is_err() {
                                    // The writer failed: its error is the one reported.
                                    return Err(Error::Store(mdl_store::StoreError::Output(
                                        std::io::Error::other("the record writer stopped"),
                                    )));
                                }
                            }
                        }
                        Coding::Whole(payload, planes) => {
                            let coded = payload.add(self.engine, x, against).map_err(encoder)?;
                            planes.resize_with(coded.len(), Vec::new);
                            planes.iter_mut().zip(coded).for_each(|(p, c)| p.extend(c));
                        }
                    }
                }
                Ok(())
            });
            drop(tx);
            if let Some(written) = written {
                let written = written.join().expect("the record writer does not panic");
                written.map_err(|e| Error::Store(mdl_store::StoreError::Output(e)))?;
            }
            read
        })
    }
}

/// A float record written by [`Coder::write_floats`].
pub(in crate::commit) struct FloatRecord<'c> {
    pub(in crate::commit) id: ObjectId,
    pub(in crate::commit) choice: &'c float::Choice,
    pub(in crate::commit) codec: CodecTag,
    pub(in crate::commit) placement: Placement,
    pub(in crate::commit) side: Side,
}

/// What a [`FloatRecord`] encodes, of a pass over a tensor (`data`) and another version of it
/// (`base`).
#[derive(Clone, Copy)]
pub(in crate::commit) enum Side {
    /// `data` alone.
    Data,
    /// `data` as a delta against `base`.
    DataOnBase,
    /// `base` as a delta against `data` (a reverse re-encode).
    BaseOnData,
}

/// Where one record of [`Coder::write_floats`] goes while it is encoded.
enum Writer<'b, 's> {
    /// A framed payload, written frame by frame into its record.
    Framed {
        frames: float::FrameEncoder,
        out: mdl_store::RecordWriter<'b, 's>,
    },
    /// A payload whose plane heads need every chunk's length: each plane's chunks, held.
    Whole {
        payload: float::PayloadWriter,
        planes: Vec<Vec<Vec<u8>>>,
    },
}

/// What [`Coder::encode`] encodes one record with: a framed record's encoder and the index of
/// its output, or a whole payload's writer and its planes' chunks.
enum Coding<'w> {
    Frames(&'w mut float::FrameEncoder, usize),
    Whole(&'w mut float::PayloadWriter, &'w mut Vec<Vec<Vec<u8>>>),
}

impl<'b, 's> Writer<'b, 's> {
    /// A framed payload of `choice`'s planes into `out`, its head written.
    fn framed(
        id: ObjectId,
        header: &mdl_format::TensorHeader,
        choice: &float::Choice,
        with_base: bool,
        mut out: mdl_store::RecordWriter<'b, 's>,
    ) -> Result<Self> {
        let frames =
            float::FrameEncoder::new(header.dtype, choice.transform, choice.xor_mask, with_base)
                .map_err(|source| Error::Encode { id, source })?;
        out.write_all(&frames.head())
            .map_err(|e| Error::Store(mdl_store::StoreError::Output(e)))?;
        Ok(Writer::Framed { frames, out })
    }
}
