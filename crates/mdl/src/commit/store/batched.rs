//! A commit's tensors that an engine codes on its device, made together: before the per-tensor
//! work, the ids, counts and float records of the tensors stored whole from memory are made
//! for a group of them at once ([`Engine::content_ids`], [`float::count_whole`],
//! [`float::encode_whole`]), so that the device is waited on a few times a group rather than
//! a few times a tensor. The per-tensor work then takes what was made for its tensor
//! ([`StoreCtx::store_tensor`]) and decides as it always does; where it decides otherwise (the
//! repository has the object, zstd wins), what was made is dropped.
//!
//! [`Engine::content_ids`]: mdl_codec::engine::Engine::content_ids

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use mdl_codec::engine::Kept;
use mdl_codec::{float, SMALL_TENSOR};
use mdl_format::{Exactness, ObjectId};

use super::{floats_pay, is_delta_candidate, StoreCtx, Stored, STREAMED_TENSOR};
use crate::policy::DeltaMode;
use crate::{per_tensor, Error, Result};

/// Bytes of tensors a group holds at most: what was made for a group (its coded records) is
/// held until its tensors are stored.
const GROUP_BYTES: u64 = 1 << 30;

/// What was made for one tensor before its turn.
pub(super) struct Ready {
    pub(super) id: ObjectId,
    /// Its plain count, unless the repository had the object.
    pub(super) count: Option<float::PlaneCount>,
    /// Its float-split payload, where that record pays ([`floats_pay`]).
    pub(super) encoded: Option<float::Encoded>,
}

/// What was made for the group being stored, by piece.
#[derive(Default)]
pub(in crate::commit) struct Made(Mutex<HashMap<usize, Ready>>);

impl Made {
    /// What was made for piece `i`, taken.
    pub(super) fn take(&self, i: usize) -> Option<Ready> {
        self.0.lock().unwrap().remove(&i)
    }
}

impl StoreCtx<'_> {
    /// Stores every piece: those made together, a group at a time, then the rest (a second
    /// moment and the first moment coded in its units one after the other, so that the second
    /// moment's content is held no longer), then the copies stored as their masters' casts,
    /// each in parallel. Results in piece order.
    pub(in crate::commit) fn store_all(&self) -> Result<Vec<(Stored, Exactness)>> {
        let pieces = &self.input.pieces;
        let cast_of = |i: usize| self.casts.get(i).copied().flatten();
        // The first moments that follow each second moment.
        let mut first_of: HashMap<usize, Vec<usize>> = HashMap::new();
        for i in 0..pieces.len() {
            if let Some(v) = self
                .plans
                .get(i)
                .and_then(Option::as_ref)
                .and_then(|p| p.follows())
            {
                first_of.entry(v).or_default().push(i);
            }
        }
        let followers: HashSet<usize> = first_of.values().flatten().copied().collect();
        let masters: HashSet<usize> = self.casts.iter().flatten().copied().collect();
        let (copies, own): (Vec<usize>, Vec<usize>) = (0..pieces.len())
            .filter(|i| !followers.contains(i))
            .partition(|&i| cast_of(i).is_some());
        let (together, alone): (Vec<usize>, Vec<usize>) =
            own.into_iter().partition(|&i| self.made_together(i));
        let mut out: Vec<Option<(Stored, Exactness)>> = pieces.iter().map(|_| None).collect();
        let mut store = |group: &[usize]| -> Result<()> {
            let followers = |i: usize| first_of.get(&i).map_or(&[][..], |f| &f[..]);
            let size = |&i: &usize| -> u64 {
                pieces[i].len + followers(i).iter().map(|&m| pieces[m].len).sum::<u64>()
            };
            let results = per_tensor(group, size, |&i| {
                let stored = self.store_tensor(i)?;
                let after = (followers(i).iter())
                    .map(|&m| Ok((m, self.store_follower(m, i, &stored.0)?)))
                    .collect::<Result<Vec<_>>>()?;
                if !after.is_empty() && !masters.contains(&i) {
                    self.forget_followed(i);
                }
                Ok((stored, after))
            })?;
            for (&i, (r, after)) in group.iter().zip(results) {
                out[i] = Some(r);
                for (m, r) in after {
                    out[m] = Some(r);
                }
            }
            Ok(())
        };
        let mut group = Vec::new();
        let mut held = 0;
        for (k, &i) in together.iter().enumerate() {
            group.push(i);
            held += pieces[i].len;
            if held >= GROUP_BYTES || k + 1 == together.len() {
                // The group's device copies live until its tensors are stored.
                let _kept = self.make(&group)?;
                store(&group)?;
                group.clear();
                held = 0;
            }
        }
        store(&alone)?;
        // Copies stored as their masters' casts come last, once their masters are stored.
        let results = per_tensor(
            &copies,
            |&i| pieces[i].len,
            |&i| {
                let j = cast_of(i).expect("a copy has a master");
                let master = &out[j].as_ref().expect("a master is stored first").0;
                self.store_cast(i, j, master)
            },
        )?;
        for (&i, r) in copies.iter().zip(results) {
            out[i] = Some(r);
        }
        Ok(out
            .into_iter()
            .map(|r| r.expect("every piece stored"))
            .collect())
    }

    /// Whether piece `i` is made with the others: a float tensor held by a caller (read where
    /// it lies), stored exactly and whole (no forward delta is counted with it), that the
    /// engine codes on its device.
    fn made_together(&self, i: usize) -> bool {
        let info = &self.input.pieces[i];
        is_delta_candidate(info)
            && (SMALL_TENSOR..STREAMED_TENSOR).contains(&info.len)
            && self.plan(i).is_none()
            && self.trim_bits.is_none()
            && self.policy.mode != DeltaMode::Forward
            && self.input.is_stable(i)
            && !self.coder.engine.splits_on_host(self.input.tensor(i))
    }

    /// Makes the ids, counts and float records of `group`'s pieces, for their turn. Returns
    /// the engine's copies of the tensors that were not on its device already (each copied
    /// over once, for all of this and for their turn).
    fn make(&self, group: &[usize]) -> Result<Vec<Kept<'_>>> {
        let engine = self.coder.engine;
        let pieces = &self.input.pieces;
        let kept = group
            .iter()
            .map(|&i| engine.keep(self.input.tensor(i)))
            .collect();
        let prefixes: Vec<Vec<u8>> = group
            .iter()
            .map(|&i| pieces[i].header.canonical())
            .collect();
        let named: Vec<(&[u8], &[u8])> = (group.iter().zip(&prefixes))
            .map(|(&i, p)| (&p[..], self.input.tensor(i)))
            .collect();
        let ids = engine.content_ids(&named);
        // Only what the repository lacks is counted and coded.
        let new: Vec<(usize, ObjectId)> = {
            let meta = self.repo.store().meta().read()?;
            let mut new = Vec::new();
            for (&i, id) in group.iter().zip(&ids) {
                if meta.object(id)?.is_none() {
                    new.push((i, *id));
                }
            }
            new
        };
        let encoder = |id: ObjectId| move |source| Error::Encode { id, source };
        let first = new.first().map_or(ObjectId::from_bytes([0; 32]), |n| n.1);
        let items: Vec<_> = (new.iter())
            .map(|&(i, _)| (pieces[i].header.dtype, self.input.tensor(i)))
            .collect();
        let counts = float::count_whole(engine, &items).map_err(encoder(first))?;
        let analyses: Vec<float::Analysis> =
            counts.iter().map(|c| float::analysis_of(c, &[])).collect();
        // The records `write_whole` would code: those where the float codecs pay.
        let pays: Vec<bool> = (analyses.iter().zip(&items))
            .map(|(a, (_, data))| {
                let len = data.len() as u64;
                floats_pay(a.plain.size, len) && a.plain.size < len
            })
            .collect();
        let jobs: Vec<_> = (items.iter().zip(&analyses).zip(&pays))
            .filter(|(_, &pays)| pays)
            .map(|((&(dtype, data), a), _)| (dtype, data, &a.plain))
            .collect();
        let mut encoded = float::encode_whole(engine, &jobs)
            .map_err(encoder(first))?
            .into_iter();
        let mut made = self.made.0.lock().unwrap();
        for (&i, id) in group.iter().zip(ids) {
            made.insert(
                i,
                Ready {
                    id,
                    count: None,
                    encoded: None,
                },
            );
        }
        for ((&(i, _), count), pays) in new.iter().zip(counts).zip(pays) {
            let ready = made.get_mut(&i).expect("made above");
            ready.count = Some(count);
            ready.encoded = pays.then(|| encoded.next().expect("one a paying tensor"));
        }
        Ok(kept)
    }
}
