//! A previous version re-encoded as a delta against its new version (reverse deltas): one
//! rule and one pass whether a commit does it at once or a deferred re-encode does it later
//! ([`crate::commit::run_deferred`]), so both leave the same bytes. The previous version is
//! counted in the orientation it is stored in — its own planes and its delta against the new
//! version — so the choice is made from the counts it is coded with (no second count with the
//! roles swapped); a tensor held in memory is split into those planes once, for its counts and
//! its codes.

use mdl_codec::engine::Engine;
use mdl_codec::float::{self, Count, PlaneCount, ToCount};
use mdl_codec::planes::Transform;
use mdl_codec::CodecTag;
use mdl_format::{Dtype, FormatError, ObjectId, TensorHeader};
use mdl_store::{IndexEntry, Placement};

use super::coder::{Coder, FloatRecord, Side};
use super::content::{pass, Content};
use super::{delta_codec, floats_pay};
use crate::{Error, Result};

/// Re-encoding a previous version as a delta must save at least this fraction of its record.
pub(in crate::commit) const REWRITE_GAIN_FLOOR: f64 = 0.02;

/// A previous version and the new version it may be re-encoded against.
pub(in crate::commit) struct Reverse<'c> {
    pub(in crate::commit) prev: ObjectId,
    pub(in crate::commit) prev_entry: IndexEntry,
    pub(in crate::commit) prev_data: &'c Content<'c>,
    pub(in crate::commit) new: ObjectId,
    /// The new version's depth in its chain (0: self-contained).
    pub(in crate::commit) new_depth: u32,
    pub(in crate::commit) data: &'c Content<'c>,
}

impl Coder<'_> {
    /// Re-encodes `r.prev` as a delta against `r.data` into the batch when that pays: the delta
    /// chosen must pay as a float record ([`floats_pay`]) and save
    /// [`REWRITE_GAIN_FLOOR`] of its record. Its new index entry, or `None` when it stays as it
    /// is.
    ///
    /// What is counted is decided on the first 32 Ki elements ([`float::delta_to_count`]): on
    /// a larger tensor, the one delta that codes smallest there, with the planes XORed that
    /// gain there, so the rest is counted once, as it is coded (a tensor read a window at a
    /// time is still read to its end when none gains); a tensor of 32 Ki elements or fewer has
    /// its planes and both deltas counted and the best taken.
    pub(in crate::commit) fn write_reverse(
        &self,
        header: &TensorHeader,
        r: &Reverse<'_>,
    ) -> Result<Option<IndexEntry>> {
        let encoder = |source| Error::Encode { id: r.prev, source };
        let dtype = header.dtype;
        let placement = Placement {
            generation: r.prev_entry.generation + 1,
            base: Some(r.new),
            depth: r.new_depth + 1,
        };
        // Held in memory, where few elements changed, a masked delta (one mask for all planes)
        // may code smaller than any plane by plane; clearly small, nothing else is counted.
        let masked = match (r.prev_data, r.data) {
            (Content::Memory(prev), Content::Memory(new)) => {
                float::encode_masked(dtype, prev, new).map_err(encoder)?
            }
            _ => None,
        };
        let write_masked = |m: &float::DeltaPayload| -> Result<Option<IndexEntry>> {
            let codec = CodecTag::delta(m.transform);
            let put = (self.batch).put_payload(&r.prev, header, codec, placement, &[&m.payload])?;
            Ok(Some(put.entry))
        };
        if let Some(m) = &masked {
            let size = m.payload.len();
            if size < r.prev_data.len() / float::MASKED_AT_ONCE && pays(size as u64, r) {
                return write_masked(m);
            }
        }
        // Held in memory, the tensor is one window, split once for its counts and its codes
        // (on the host: a device counts and codes where it holds them); read a window at a
        // time, one pass counts and another encodes.
        let split = match (r.prev_data, r.data) {
            (Content::Memory(prev), Content::Memory(_)) => self.engine.splits_on_host(prev),
            _ => false,
        };
        let mut counted: Option<Counted> = None;
        pass(
            r.prev_data,
            Some(r.data),
            dtype.size(),
            None,
            &mut |d, b| {
                let b = b.expect("a base");
                let counted = match &mut counted {
                    Some(c) => c,
                    None => {
                        counted.insert(Counted::new(self.engine, dtype, d, b).map_err(encoder)?)
                    }
                };
                counted.add(self.engine, d, b, split).map_err(encoder)
            },
        )?;
        let Some(counted) = counted else {
            return Ok(None);
        };
        let choice = counted.choice().filter(|c| pays(c.size, r));
        if let Some(m) = masked.filter(|m| {
            let size = m.payload.len() as u64;
            pays(size, r) && choice.as_ref().is_none_or(|c| size < c.size)
        }) {
            return write_masked(&m);
        }
        let Some(choice) = choice else {
            return Ok(None);
        };
        if !split {
            let record = FloatRecord {
                id: r.prev,
                choice: &choice,
                codec: delta_codec(&choice),
                placement,
                side: Side::BaseOnData,
            };
            return Ok(Some(
                self.write_floats(header, r.data, Some(r.prev_data), &[record])?[0],
            ));
        }
        let planes = counted.planes_of(&choice);
        let encoded =
            float::encode_split(self.engine, dtype, &planes, true, &choice).map_err(encoder)?;
        Ok(Some(
            self.batch
                .put_payload(
                    &r.prev,
                    header,
                    delta_codec(&choice),
                    placement,
                    &encoded.pieces(),
                )?
                .entry,
        ))
    }
}

/// What is counted of a previous version against its new version: each kind's counts and,
/// for a tensor held in memory, its planes (empty otherwise).
struct Counted {
    kinds: Vec<Count>,
    counts: Vec<PlaneCount>,
    planes: Vec<Vec<Vec<u8>>>,
}

impl Counted {
    /// The counts [`float::delta_to_count`] asks for, judged from the first windows of the
    /// previous version (`prev`) and the new one.
    fn new(
        engine: &dyn Engine,
        dtype: Dtype,
        prev: &[u8],
        new: &[u8],
    ) -> std::result::Result<Counted, FormatError> {
        let kinds = match float::delta_to_count(engine, dtype, prev, new)? {
            ToCount::Everything => vec![Count::Plain, Count::Xor, Count::Sub],
            ToCount::Delta(kind) => vec![kind],
            ToCount::Nothing => Vec::new(),
        };
        let counts = kinds
            .iter()
            .map(|&k| PlaneCount::new(dtype, k))
            .collect::<std::result::Result<_, _>>()?;
        Ok(Counted {
            planes: vec![Vec::new(); kinds.len()],
            kinds,
            counts,
        })
    }

    /// Counts the next window of the previous version (`prev`) and of the new one, splitting it
    /// into the planes it is counted from when `split` (a tensor held in memory: one window).
    fn add(
        &mut self,
        engine: &dyn Engine,
        prev: &[u8],
        new: &[u8],
        split: bool,
    ) -> std::result::Result<(), FormatError> {
        for ((count, kind), planes) in self
            .counts
            .iter_mut()
            .zip(&self.kinds)
            .zip(&mut self.planes)
        {
            let base = (*kind != Count::Plain).then_some(new);
            match split {
                true => count.add_splitting(engine, prev, base, planes)?,
                false => count.add(engine, prev, base)?,
            }
        }
        Ok(())
    }

    /// The delta chosen, once the whole tensor is counted: the best of both against the
    /// planes as they are, or the one delta counted.
    fn choice(&self) -> Option<float::Choice> {
        match self.kinds.first()? {
            Count::Plain => float::analysis_of(&self.counts[0], &self.counts[1..])
                .best_delta()
                .cloned(),
            _ => Some(self.counts[0].choice()),
        }
    }

    /// The planes split for `choice`: the difference's, or each float plane XORed with the
    /// new version's or taken as it is, as its mask says.
    fn planes_of(&self, choice: &float::Choice) -> Vec<&[u8]> {
        let of = |kind: Count| {
            let k = self.kinds.iter().position(|&x| x == kind);
            k.map(|k| self.planes[k].as_slice())
        };
        fn as_slices(planes: &[Vec<u8>]) -> Vec<&[u8]> {
            planes.iter().map(Vec::as_slice).collect()
        }
        match choice.transform {
            Transform::Sub => of(Count::Sub).map(as_slices),
            Transform::Planes => of(Count::Masked(choice.xor_mask))
                .map(as_slices)
                .or_else(|| {
                    let (plain, xor) = (of(Count::Plain)?, of(Count::Xor)?);
                    Some(
                        (0..plain.len())
                            .map(|p| {
                                let xored = choice.xor_mask & (1 << p) != 0;
                                if xored { &xor[p] } else { &plain[p] }.as_slice()
                            })
                            .collect(),
                    )
                }),
        }
        .expect("the choice is of planes that were split")
    }
}

/// Whether a delta of `size` bytes of the previous version pays (see [`Coder::write_reverse`]).
fn pays(size: u64, r: &Reverse<'_>) -> bool {
    floats_pay(size, r.prev_data.len() as u64)
        && size as f64 <= r.prev_entry.stored_len as f64 * (1.0 - REWRITE_GAIN_FLOOR)
}
