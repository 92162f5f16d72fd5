//! Large tensors (stored exactly, [`crate::BIG_TENSOR`] bytes or more), read a window at a
//! time and written framed, so a commit's memory is bounded by the window whatever the size.
//!
//! A tensor no delta is made of now (the default: reverse deltas are deferred) whose previous
//! version differs in its first window is encoded in one pass that also hashes it; the record
//! is named by the hash at the end, or dropped if the store has that object already. Any
//! other is hashed first (an unchanged tensor costs a hash, not an encoding) and encoded in a
//! second pass if it is new. Both routes write the same bytes.
//!
//! A process that commits steps with forward deltas (an RL trainer) holds the last step's
//! version in its warm set and the new one in memory: there a large tensor is first tried as a
//! masked delta over the version held ([`StoreCtx::store_large_masked`]), which holds its mask
//! and its changed elements' words (where at most a quarter changed) besides what is already
//! in memory, and costs a comparing pass where few elements changed.

use std::borrow::Cow;

use mdl_codec::float::{self, Count};
use mdl_codec::CodecTag;
use mdl_format::ObjectId;

use super::content::{pass, window_bytes, Content};
use super::lossless::Counted;
use super::{floats_pay, previous_object, StoreCtx, Stored};
use crate::policy::DeltaMode;
use crate::warm::WarmTensors;
use crate::{Error, Result};
use mdl_format::Exactness;

impl StoreCtx<'_> {
    /// Stores large tensor `i`.
    pub(super) fn store_large(&self, i: usize) -> Result<(Stored, Exactness)> {
        // A delta made now compares counts of the whole tensor and its previous version.
        let whole = match self.policy.mode {
            DeltaMode::Off => false,
            DeltaMode::Forward => true,
            DeltaMode::Reverse => !self.policy.defer,
        };
        if !whole {
            let info = &self.input.pieces[i];
            let n = window_bytes(info.header.dtype.size()).min(info.len as usize);
            // Bytes also on a GPU are read in place (they do not change meanwhile).
            let first: Cow<'_, [u8]> = if self.input.on_device(i) {
                Cow::Borrowed(&self.input.tensor(i)[..n])
            } else {
                let mut buf = vec![0u8; n];
                self.input.read_into(i, 0, &mut buf)?;
                Cow::Owned(buf)
            };
            if !self.first_window_unchanged(i, &first)? {
                if let Some(stored) = self.store_speculative(i, &first)? {
                    return Ok(stored);
                }
            }
        }
        self.store_streamed(i, whole)
    }

    /// Stores large tensor `i` as a masked delta over its previous version where the warm set
    /// holds that version, the policy lets a forward delta join its chain and few elements
    /// changed; or as nothing where it did not change. The caller has checked that the tensor
    /// lies in host memory that nothing changes meanwhile. `None`: none of that, and nothing
    /// was claimed or written ([`Self::store_large`] takes it).
    pub(super) fn store_large_masked(
        &self,
        i: usize,
        warm: &WarmTensors,
    ) -> Result<Option<(Stored, Exactness)>> {
        let info = &self.input.pieces[i];
        let previous = {
            let meta = self.repo.store().meta().read()?;
            previous_object(&meta, self.previous, self.input, i)?
        };
        let Some((prev, held)) = previous.and_then(|(id, _, _)| Some((id, warm.get(&id)?))) else {
            return Ok(None);
        };
        let data = self.input.tensor(i);
        let id = self.coder.engine.content_id(&info.header.canonical(), data);
        let unchanged = Stored {
            id,
            added: None,
            rewrite: None,
        };
        if id == prev {
            // The parent's object: the store has it, so this only claims it.
            self.is_new(&id, i, data)?;
            self.progress.advance(info.len);
            return Ok(Some((unchanged, Exactness::Lossless)));
        }
        // The previous version, unless the chain is full (a whole version starts it again).
        let Some((base, entry)) = self.delta_base(i, &id)? else {
            return Ok(None);
        };
        let masked = float::encode_masked(info.header.dtype, data, &held)
            .map_err(|source| Error::Encode { id, source })?;
        drop(held);
        let Some(m) = masked.filter(|m| m.payload.len() < data.len() / float::MASKED_AT_ONCE)
        else {
            return Ok(None);
        };
        let stored = match self.is_new(&id, i, data)? {
            true => self.write_masked(id, i, &m, &base, &entry)?,
            false => unchanged,
        };
        self.progress.advance(info.len);
        Ok(Some((stored, Exactness::Lossless)))
    }

    /// Whether tensor `i`'s previous version (same name, dtype and shape) has the same first
    /// window (`first`, tensor `i`'s): then it may well be unchanged, and is hashed before
    /// anything is encoded.
    fn first_window_unchanged(&self, i: usize, first: &[u8]) -> Result<bool> {
        let store = self.repo.store();
        let previous = {
            let meta = store.meta().read()?;
            previous_object(&meta, self.previous, self.input, i)?
        };
        let Some((id, entry, _)) = previous else {
            return Ok(false);
        };
        if entry.content_len != self.input.pieces[i].len || first.is_empty() {
            return Ok(false);
        }
        let mut theirs = vec![0u8; first.len()];
        // A previous version that does not decode is not this content either.
        let read = store
            .tensor_windows(&id, &entry)
            .and_then(|mut w| w.next_into(&mut theirs));
        Ok(read.is_ok() && first == theirs)
    }

    /// Encodes tensor `i` as float-split in one pass that hashes it too, if its first window
    /// (`first`) says the float codecs pay (`None`: they do not, and zstd or raw compete
    /// instead).
    fn store_speculative(&self, i: usize, first: &[u8]) -> Result<Option<(Stored, Exactness)>> {
        let info = &self.input.pieces[i];
        let dtype = info.header.dtype;
        let unknown = ObjectId::from_bytes([0; 32]);
        let encoder = |source| Error::Encode {
            id: unknown,
            source,
        };
        let mut plain = float::PlaneCount::new(dtype, Count::Plain).map_err(encoder)?;
        plain.add(self.coder.engine, first, None).map_err(encoder)?;
        // What [`Self::encode_new`] decides from the same count.
        let analysis = float::analysis_of(&plain, &[]);
        if !floats_pay(analysis.plain.size, plain.counted_bytes()) {
            return Ok(None);
        }
        let data = Content::Input {
            input: self.input,
            i,
            id: unknown,
        };
        let (id, record) = self
            .coder
            .write_unnamed(&info.header, &data, &analysis.plain)?;
        let added = if self.is_new(&id, i, self.input.tensor(i))? {
            if self.policy.mode == DeltaMode::Reverse && self.base_for(i, &id, false)?.is_some() {
                // The previous version is re-encoded against this one after the publish.
                self.deferred
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
            Some((id, record.finish_as(&id)?.entry))
        } else {
            None
        };
        self.progress.advance(info.len);
        let stored = Stored {
            id,
            added,
            rewrite: None,
        };
        Ok(Some((stored, Exactness::Lossless)))
    }

    /// Stores a large tensor, stored exactly, without ever holding it: one pass hashes it (and
    /// counts its float planes: all of them when a delta is made now, else the first window's,
    /// enough to choose between the float codecs and zstd), and if the store does not have it,
    /// [`Self::encode_new`] reads it (and its previous version) a window at a time again.
    fn store_streamed(&self, i: usize, whole: bool) -> Result<(Stored, Exactness)> {
        let info = &self.input.pieces[i];
        let dtype = info.header.dtype;
        let mut plain =
            float::PlaneCount::new(dtype, Count::Plain).expect("delta candidates are float");
        let mut failed = None;
        // Its id is what this pass finds; nothing is encoded from it here.
        let unhashed = Content::Input {
            input: self.input,
            i,
            id: ObjectId::from_bytes([0; 32]),
        };
        let id = pass(
            &unhashed,
            None,
            dtype.size(),
            Some(info.header.hasher()),
            &mut |d, _| {
                if whole || plain.counted_bytes() == 0 {
                    if let Err(e) = plain.add(self.coder.engine, d, None) {
                        failed = Some(e);
                    }
                }
                Ok(())
            },
        )?
        .expect("the input is hashed");
        if let Some(source) = failed {
            return Err(Error::Encode { id, source });
        }
        let result = if !self.is_new(&id, i, self.input.tensor(i))? {
            Stored {
                id,
                added: None,
                rewrite: None,
            }
        } else {
            let data = Content::Input {
                input: self.input,
                i,
                id,
            };
            let counted = Counted {
                plain: Some(plain),
                encoded: None,
            };
            self.encode_new(id, i, data, CodecTag::FloatSplit, counted)?
        };
        self.progress.advance(info.len);
        Ok((result, Exactness::Lossless))
    }
}
