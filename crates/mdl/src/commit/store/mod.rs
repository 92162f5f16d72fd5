//! Storing one tensor: already stored, quantized under a plan, mantissa-trimmed, or exactly
//! (`lossless.rs`; a large tensor a window at a time, `large.rs`), and which previous version
//! a delta may be made against. Below it: the float codecs' passes (`coder.rs`) over a
//! tensor's content read whole or a window at a time (`content.rs`), into buffers kept for the
//! next tensor (`spare.rs`), and a previous version's reverse re-encode (`reverse.rs`) — what a
//! deferred re-encode uses too.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};

use mdl_codec::engine::{FloatView, Kept};
use mdl_codec::qrecord::QuantTensor;
use mdl_codec::quant::Correction;
use mdl_codec::scalar::lossy_supported;
use mdl_codec::{float, residual, trim, CodecTag, EncodeOptions, SMALL_DELTA};
use mdl_format::{Exactness, Lossy, ObjectId};
use mdl_store::meta::MetaRead;
use mdl_store::{IndexEntry, Placement, Store};

mod batched;
mod cast;
pub(super) mod coder;
pub(super) mod content;
mod follow;
mod large;
mod lossless;
pub(super) mod reverse;
pub(super) mod spare;

use crate::input::{Input, Piece};
use crate::lossy::{Encoded, TensorPlan};
use crate::policy::{DeltaMode, DeltaPolicy};
use crate::previous::Previous;
use crate::rewrite::{chain, Rewrite};
use crate::warm::WarmTensors;
use crate::{lossy, Progress, Repository, Result};
pub(in crate::commit) use batched::Made;
use batched::Ready;
pub(in crate::commit) use cast::cast_pairs;
use coder::Coder;
use content::Content;
use lossless::Counted;
use reverse::REWRITE_GAIN_FLOOR;
use spare::Spare;

/// Float tensors whose best float encoding saves less than this fraction also try zstd.
const FLOAT_GAIN_FLOOR: f64 = 0.03;

/// Whether a float record of `size` bytes of a tensor of `len` saves enough for the float
/// codecs alone to be tried ([`FLOAT_GAIN_FLOOR`]).
fn floats_pay(size: u64, len: u64) -> bool {
    size as f64 <= len as f64 * (1.0 - FLOAT_GAIN_FLOOR)
}

/// Tensors of at least this size, stored exactly, are read a window at a time (with their
/// previous versions) instead of being held: a commit's memory stays bounded by the window
/// (`large.rs`).
const STREAMED_TENSOR: u64 = crate::BIG_TENSOR;

/// One tensor's outcome.
pub(super) struct Stored {
    pub(super) id: ObjectId,
    /// Its new record, unless the repository already had the object.
    pub(super) added: Option<(ObjectId, IndexEntry)>,
    /// The previous version, re-encoded against this one (reverse deltas).
    pub(super) rewrite: Option<Box<Rewrite>>,
}

/// What a tensor is stored as ([`StoreCtx::render`]).
enum Rendering {
    /// Its content as read.
    Exact,
    /// Quantized under the commit's lossy plan: the reconstruction, how it is encoded, and what
    /// that cost.
    Quantized {
        content: Vec<u8>,
        encoded: Encoded,
        lossy: Lossy,
    },
    /// Its mantissas trimmed (`lossy.trim_bits`), and what that cost.
    Trimmed { content: Vec<u8>, lossy: Lossy },
}

impl Rendering {
    /// The content stored, where it is not the content as read.
    fn content(&self) -> Option<&[u8]> {
        match self {
            Rendering::Exact => None,
            Rendering::Quantized { content, .. } | Rendering::Trimmed { content, .. } => {
                Some(content)
            }
        }
    }

    fn into_content(self) -> Option<Vec<u8>> {
        match self {
            Rendering::Exact => None,
            Rendering::Quantized { content, .. } | Rendering::Trimmed { content, .. } => {
                Some(content)
            }
        }
    }

    fn exactness(&self) -> Exactness {
        match self {
            Rendering::Exact => Exactness::Lossless,
            Rendering::Quantized { lossy, .. } | Rendering::Trimmed { lossy, .. } => {
                Exactness::Lossy(lossy.clone())
            }
        }
    }
}

/// Everything the per-tensor work shares.
pub(super) struct StoreCtx<'a> {
    pub(super) repo: &'a Repository,
    /// The float passes, and the batch and kernels every record goes through.
    pub(super) coder: Coder<'a>,
    pub(super) input: &'a Input,
    pub(super) previous: &'a Previous<'a>,
    pub(super) policy: DeltaPolicy,
    pub(super) encode: &'a EncodeOptions,
    /// Objects this commit is storing (a checkpoint may hold the same tensor twice).
    pub(super) claimed: Mutex<HashSet<ObjectId>>,
    /// Objects this commit is re-encoding.
    pub(super) rewritten: Mutex<HashSet<ObjectId>>,
    /// Whether a previous version's re-encode was left for after the publish.
    pub(super) deferred: AtomicBool,
    pub(super) progress: &'a dyn Progress,
    /// How each tensor is quantized (`None`: not quantized).
    /// Each tensor's lossy plan, by piece; empty for a lossless commit.
    pub(super) plans: &'a [Option<TensorPlan>],
    /// Mantissa bits kept, in trim mode.
    pub(super) trim_bits: Option<u32>,
    /// Adam's bias corrections at this checkpoint's step.
    pub(super) correction: Correction,
    /// The settings words naming the betas of `correction` (a lossy commit's), recorded by
    /// each tensor priced with its moments.
    pub(super) betas_words: Option<String>,
    /// The last commit's tensors, kept by a process that commits repeatedly.
    pub(super) warm: Option<&'a WarmTensors>,
    /// Objects the parent names more than once: their kept buffers are not written over.
    pub(super) repeated: HashSet<ObjectId>,
    /// Whether residual records' content is kept decoded (`quant.tips`).
    pub(super) keep_tips: bool,
    /// Buffers tensors are read into, and split into planes, kept for the next tensors.
    pub(super) spare_tensors: Spare<Vec<u8>>,
    pub(super) spare_planes: Spare<Vec<Vec<u8>>>,
    /// What was made for the tensors of the group being stored (`batched.rs`).
    pub(super) made: Made,
    /// Each piece's master where it is stored as the master's cast (`cast.rs`).
    pub(super) casts: &'a [Option<usize>],
    /// Every piece other pieces are coded against (a copy's master, a first moment's second
    /// moment).
    pub(super) followed: HashSet<usize>,
    /// Their content where it was stored otherwise than read (quantized, trimmed), until the
    /// pieces that follow them are stored.
    pub(super) kept: Mutex<HashMap<usize, Arc<Vec<u8>>>>,
    /// The plans of the pieces that follow another piece of this commit
    /// ([`TensorPlan::follows`]), with their reference, given once that piece is stored.
    pub(super) resolved: HashMap<usize, OnceLock<TensorPlan>>,
}

impl StoreCtx<'_> {
    /// Piece `i`'s lossy plan, if the commit is lossy and it has one.
    fn plan(&self, i: usize) -> Option<&TensorPlan> {
        match self.resolved.get(&i).and_then(OnceLock::get) {
            Some(plan) => Some(plan),
            None => self.plans.get(i).and_then(Option::as_ref),
        }
    }

    /// Stores tensor `i`; also returns what the manifest says about it.
    pub(super) fn store_tensor(&self, i: usize) -> Result<(Stored, Exactness)> {
        let info = &self.input.pieces[i];
        if info.len >= STREAMED_TENSOR
            && is_delta_candidate(info)
            && self.plan(i).is_none()
            && self.trim_bits.is_none()
        {
            // A committer of forward steps keeps large tensors too, where they lie in host
            // memory nothing changes meanwhile: the next step's masked delta is made against them.
            let kept = self.warm.filter(|_| {
                self.policy.mode == DeltaMode::Forward
                    && self.input.is_stable(i)
                    && !self.input.on_device(i)
            });
            let stored = match kept.map(|w| self.store_large_masked(i, w)).transpose()? {
                Some(Some(stored)) => stored,
                _ => self.store_large(i)?,
            };
            if let Some(warm) = kept {
                self.keep_warm(warm, i, stored.0.id, self.input.tensor(i));
            }
            return Ok(stored);
        }
        // What is hashed must be exactly what is encoded: a file's bytes, which may change
        // underneath, are copied first. Bytes nobody changes meanwhile (a caller's buffer) are
        // read where they lie; where the warm cache keeps them past the commit, they are copied
        // for it once stored (`keep_warm`), except for a GPU's, whose copy the engine makes
        // from the device for this commit's kernels too.
        let kept_warm = self.warm.filter(|_| is_delta_candidate(info));
        let stable = self.input.is_stable(i);
        let kept_late = kept_warm.filter(|_| stable && !self.input.on_device(i));
        let copy = match (kept_warm.is_some() && kept_late.is_none()) || !stable {
            true => {
                let mut buf = self.spare_tensors.take().keep();
                buf.resize(info.len as usize, 0);
                self.input.read_into(i, 0, &mut buf)?;
                Some(Arc::new(buf))
            }
            false => None,
        };
        let bytes: &[u8] = match &copy {
            Some(buf) => buf,
            None => self.input.tensor(i),
        };
        // Shared with the warm set if it keeps it; where the input's bytes are on a GPU
        // (adopted), the engine copies them there for this buffer, so that neither this
        // commit's kernels nor the next commit's deltas against it copy them over the bus.
        let on_device = match &copy {
            Some(buf) => self
                .coder
                .engine
                .keep_shared(buf, Some(self.input.tensor(i))),
            None => Kept::nothing(),
        };
        // The mapping is read by lossy settings (their planning, and the moments beside their
        // weights): what they read of this piece is dropped once it is stored.
        self.input.release(i);
        let rendering = self.render(i, bytes);
        let data = rendering.content().unwrap_or(bytes);
        let made = self.made.take(i);
        let id = match &made {
            Some(m) => m.id,
            None => self.coder.engine.content_id(&info.header.canonical(), data),
        };
        let result = if self.is_new(&id, i, data)? {
            self.write_new(id, i, &rendering, data, made)?
        } else {
            Stored {
                id,
                added: None,
                rewrite: None,
            }
        };
        self.keep_tip(i, &result, &rendering, data);
        self.progress.advance(info.len);
        // What the next commit's delta or residual of this tensor will be taken against (the
        // buffer itself, given away rather than copied, with its device copy).
        let exactness = rendering.exactness();
        let changed = rendering.into_content().map(Arc::new);
        if let Some(changed) = &changed {
            self.keep_for_followers(i, changed);
        }
        match (kept_warm, changed, copy) {
            (Some(warm), Some(changed), _) => warm.offer(id, changed, Kept::nothing()),
            (Some(warm), None, Some(buf)) => warm.offer(id, buf, on_device),
            (Some(warm), None, None) => self.keep_warm(warm, i, id, self.input.tensor(i)),
            (_, _, copy) => {
                drop(on_device);
                if let Some(Ok(buf)) = copy.map(Arc::try_unwrap) {
                    self.spare_tensors.give(buf);
                }
            }
        }
        Ok((result, exactness))
    }

    /// Keeps a copy of piece `i`'s content (object `id`, read where it lies) for the next
    /// commit: an unchanged tensor's buffer is carried over as it is; a changed one is written
    /// into its previous version's buffer where nothing else needs that version, so a commit
    /// that changes a model's tensors (an RL step) faults in no fresh memory for them.
    fn keep_warm(&self, warm: &WarmTensors, i: usize, id: ObjectId, bytes: &[u8]) {
        if warm.carry(&id) {
            return;
        }
        let info = &self.input.pieces[i];
        let previous = self
            .previous
            .get(&self.input.files[info.file].tree_path, &info.name)
            .map(|e| e.id)
            .filter(|p| !self.repeated.contains(p));
        let mut buf = previous
            .and_then(|p| warm.reclaim(&p, bytes.len()))
            .unwrap_or_default();
        if bytes.len() as u64 >= STREAMED_TENSOR {
            // Stored alone, so copied on every core.
            use rayon::prelude::*;
            buf.resize(bytes.len(), 0);
            (buf.par_chunks_mut(1 << 20))
                .zip(bytes.par_chunks(1 << 20))
                .for_each(|(to, from)| to.copy_from_slice(from));
        } else {
            buf.clear();
            buf.extend_from_slice(bytes);
        }
        let buf = Arc::new(buf);
        let on_device = self.coder.engine.keep_shared(&buf, Some(bytes));
        warm.offer(id, buf, on_device);
    }

    /// A residual record this commit wrote ends a chain as deep as its series: its content
    /// (`data`) is kept decoded (`.mdl/tips`), for the next commit's residual and a checkout
    /// of this one (unless `quant.tips` is off); the previous version's tip, no longer a
    /// chain's end along this branch, goes.
    fn keep_tip(&self, i: usize, stored: &Stored, rendering: &Rendering, data: &[u8]) {
        let store = self.repo.store();
        let chained = stored.added.as_ref().is_some_and(|(_, e)| e.base.is_some());
        if self.keep_tips && chained && matches!(rendering, Rendering::Quantized { .. }) {
            store.keep_tip(&stored.id, data);
        }
        self.forget_previous_tip(i, &stored.id);
    }

    /// Piece `i`'s previous version, where it is not `id`, no longer ends a chain along this
    /// branch: its kept tip goes.
    fn forget_previous_tip(&self, i: usize, id: &ObjectId) {
        let info = &self.input.pieces[i];
        let path = &self.input.files[info.file].tree_path;
        if let Some(prev) = self.previous.get(path, &info.name) {
            if prev.id != *id {
                self.repo.store().forget_tips([&prev.id]);
            }
        }
    }

    /// What tensor `i` (read into `data`) is stored as: under the commit's lossy plan for it,
    /// its mantissas trimmed, or as it is.
    fn render(&self, i: usize, data: &[u8]) -> Rendering {
        let info = &self.input.pieces[i];
        if let Some(plan) = self.plan(i) {
            return self.quantized(i, plan, data);
        }
        let trimmed = self.trim_bits.filter(|_| {
            lossy_supported(info.header.dtype)
                && info.header.numel().unwrap_or(0) >= lossy::MIN_LOSSY_ELEMENTS
        });
        match trimmed {
            Some(bits) => self.trimmed(i, bits, data),
            None => Rendering::Exact,
        }
    }

    /// Tensor `i` quantized under `plan`: a reconstruction equal to the original (an all-zero
    /// moment) stays exact, since the lossless codecs take such content for next to nothing,
    /// and so does one whose residual payload does not decode to itself — a reconstruction
    /// the decoder would not reproduce must never be stored.
    fn quantized(&self, i: usize, plan: &TensorPlan, data: &[u8]) -> Rendering {
        let info = &self.input.pieces[i];
        let w = FloatView {
            dtype: info.header.dtype,
            bytes: data,
        };
        let moments = self.input.moments(plan.moments);
        let q = {
            // The quantizer reads the weights and moments several times: a GPU engine copies
            // them over once.
            let _kept: Vec<Kept<'_>> = std::iter::once(w.bytes)
                .chain(moments.iter().flat_map(|mv| [mv.m.bytes, mv.v.bytes]))
                .map(|b| self.coder.engine.keep(b))
                .collect();
            let first = plan.first_moment().map(|m| self.input.view(m));
            lossy::quantize(self.coder.engine, w, moments, first, plan, self.correction)
        };
        let reproducible = match &q.encoded {
            Encoded::Residual { payload, reference } => {
                let mut again = vec![0u8; q.render.len()];
                let reference = reference.as_ref().map(|r| &r.content[..]);
                residual::decode(info.header.dtype, payload, reference, &mut again).is_ok()
                    && again == q.render
            }
            Encoded::Quant(_) => true,
        };
        if !reproducible {
            tracing::warn!(
                "{}: a lossy encoding did not decode to itself; stored exactly",
                info.name
            );
        }
        if q.render == data || !reproducible {
            return Rendering::Exact;
        }
        let mut lossy = q.lossy;
        if let Some(words) = self.betas_words.as_ref().filter(|_| moments.is_some()) {
            lossy.settings = format!("{} {words}", lossy.settings);
        }
        Rendering::Quantized {
            content: q.render,
            encoded: q.encoded,
            lossy,
        }
    }

    /// Tensor `i` with its mantissas trimmed to `bits`, and the error that made.
    fn trimmed(&self, i: usize, bits: u32, data: &[u8]) -> Rendering {
        let dtype = self.input.pieces[i].header.dtype;
        let mut out = vec![0u8; data.len()];
        trim::trim(dtype, data, bits, &mut out);
        let view = |bytes| FloatView { dtype, bytes };
        let err = self.coder.engine.error_stats(view(data), view(&out), None);
        Rendering::Trimmed {
            content: out,
            lossy: Lossy {
                settings: format!("trim bits={bits} bound=2^-{bits}"),
                max_abs_error: err.max_abs,
                rel_error: err.rel_l2(),
                est_delta_loss: None,
            },
        }
    }

    /// Writes tensor `i`'s new record, of content `data` hashing to `id`, as `rendering` says
    /// (with what was `made` of it beforehand).
    fn write_new(
        &self,
        id: ObjectId,
        i: usize,
        rendering: &Rendering,
        data: &[u8],
        made: Option<Ready>,
    ) -> Result<Stored> {
        let header = &self.input.pieces[i].header;
        match rendering {
            Rendering::Quantized {
                encoded: Encoded::Quant(q),
                ..
            } => self.encode_quant(id, i, q),
            Rendering::Quantized {
                encoded: Encoded::Residual { payload, reference },
                ..
            } => {
                let (codec, placement) = match reference {
                    Some(r) => (
                        CodecTag::QuantResidual,
                        Placement {
                            generation: 0,
                            base: Some(r.id),
                            depth: r.depth + 1,
                        },
                    ),
                    None => (CodecTag::QuantUniform, Placement::default()),
                };
                let out =
                    self.coder
                        .batch
                        .put_payload(&id, header, codec, placement, &[payload])?;
                Ok(Stored {
                    id,
                    added: Some((id, out.entry)),
                    rewrite: None,
                })
            }
            Rendering::Trimmed { .. } => {
                let counted = Counted::default();
                self.encode_new(
                    id,
                    i,
                    Content::Memory(data),
                    CodecTag::MantissaTrim,
                    counted,
                )
            }
            Rendering::Exact => {
                let counted = made.map_or_else(Counted::default, |m| Counted {
                    plain: m.count,
                    encoded: m.encoded,
                });
                self.encode_new(id, i, Content::Memory(data), CodecTag::FloatSplit, counted)
            }
        }
    }

    /// Whether tensor `i`, of content `data` hashing to `id`, is to be stored: neither this
    /// commit (a checkpoint may hold a tensor twice) nor the repository has it yet. An object
    /// retention coarsened gets its committed content back (`data`, read here only then).
    pub(super) fn is_new(&self, id: &ObjectId, i: usize, data: &[u8]) -> Result<bool> {
        if !self.claimed.lock().unwrap().insert(*id) {
            return Ok(false);
        }
        let store = self.repo.store();
        let Some(entry) = store.meta().read()?.object(id)? else {
            return Ok(true);
        };
        if crate::coarsen::coarsening(store, id, &entry)?.is_some() {
            crate::coarsen::restore(self.repo, id, entry, &self.input.pieces[i].header, data)?;
        }
        Ok(false)
    }

    /// Stores a quantized tensor: a quant-base, or a quant-delta against the previous version's
    /// codes (forward), or a quant-base with the previous version re-encoded against it
    /// (reverse).
    fn encode_quant(&self, id: ObjectId, i: usize, q: &QuantTensor) -> Result<Stored> {
        let info = &self.input.pieces[i];
        let header = &info.header;
        let base_payload = q.encode_base();
        let store = self.repo.store();
        let put = |payload: &[u8], codec, placement| -> Result<IndexEntry> {
            Ok(self
                .coder
                .batch
                .put_payload(&id, header, codec, placement, &[payload])?
                .entry)
        };
        let stored = |entry, rewrite| Stored {
            id,
            added: Some((id, entry)),
            rewrite,
        };
        let base = self.base_for(i, &id, true)?;
        let Some((bid, bentry)) = base else {
            return Ok(stored(
                put(&base_payload, CodecTag::QuantBase, Placement::default())?,
                None,
            ));
        };
        let prev = store.load_quant(&bid, &bentry)?;
        match self.policy.mode {
            DeltaMode::Off => Ok(stored(
                put(&base_payload, CodecTag::QuantBase, Placement::default())?,
                None,
            )),
            DeltaMode::Forward => {
                let delta = q.encode_delta(self.coder.engine, &prev.codes, prev.bins());
                let entry = if delta.len() < base_payload.len() {
                    put(
                        &delta,
                        CodecTag::QuantDelta,
                        Placement {
                            generation: 0,
                            base: Some(bid),
                            depth: bentry.depth + 1,
                        },
                    )?
                } else {
                    put(&base_payload, CodecTag::QuantBase, Placement::default())?
                };
                Ok(stored(entry, None))
            }
            DeltaMode::Reverse => {
                let entry = put(&base_payload, CodecTag::QuantBase, Placement::default())?;
                let delta = prev.encode_delta(self.coder.engine, &q.codes, q.bins());
                let rewrite = if (delta.len() as f64)
                    <= bentry.stored_len as f64 * (1.0 - REWRITE_GAIN_FLOOR)
                    && self.rewritten.lock().unwrap().insert(bid)
                {
                    let placement = Placement {
                        generation: bentry.generation + 1,
                        base: Some(id),
                        depth: 1,
                    };
                    let new = self
                        .coder
                        .batch
                        .put_payload(&bid, header, CodecTag::QuantDelta, placement, &[&delta])?
                        .entry;
                    Some(Box::new(Rewrite {
                        id: bid,
                        old: bentry,
                        new,
                    }))
                } else {
                    None
                };
                Ok(stored(entry, rewrite))
            }
        }
    }

    /// The previous version of a tensor that can serve as a delta base: same name, dtype and
    /// shape, different content, stored here, and in a chain the policy lets grow (depth cap;
    /// with reverse deltas, a self-contained record). `None` means no delta is tried at all.
    /// `quant` asks for a base whose codes a quant-delta can refer to (a quantized previous
    /// version); otherwise any previous version that is not quantized serves.
    pub(super) fn base_for(
        &self,
        i: usize,
        id: &ObjectId,
        quant: bool,
    ) -> Result<Option<(ObjectId, IndexEntry)>> {
        let meta = self.repo.store().meta().read()?;
        let Some((prev_id, entry, prev_quant)) =
            previous_object(&meta, self.previous, self.input, i)?
        else {
            return Ok(None);
        };
        if prev_id == *id || prev_quant != quant {
            return Ok(None);
        }
        // Whether the policy lets a delta join this chain, decided before the base is decoded.
        // The restore-cost cap counts record bytes read; a record not yet written is estimated
        // at the size of the one it joins (a delta is rarely larger than its base).
        let budget = self
            .policy
            .max_restore_cost
            .map_or(u64::MAX, |c| (c * entry.content_len as f64) as u64);
        let allowed = match self.policy.mode {
            DeltaMode::Off => false,
            DeltaMode::Forward => {
                entry.depth < self.policy.max_depth
                    && chain(&meta, &entry)?
                        .iter()
                        .map(|e| e.stored_len)
                        .sum::<u64>()
                        + entry.stored_len
                        <= budget
            }
            DeltaMode::Reverse => {
                reverse_allowed(self.repo.store(), &meta, &self.policy, &prev_id, &entry)?
            }
        };
        Ok(allowed.then_some((prev_id, entry)))
    }
}

/// The decoded content of a previous version: kept by the last commit of this process, or read
/// from the store.
pub(super) fn previous_content(
    store: &Store,
    warm: Option<&WarmTensors>,
    id: &ObjectId,
    entry: &IndexEntry,
) -> Result<Arc<Vec<u8>>> {
    if let Some(kept) = warm.and_then(|w| w.get(id)) {
        return Ok(kept);
    }
    Ok(Arc::new(store.load_tensor(id, entry)?))
}

/// Whether the previous version `prev` (its index entry `entry`) may be re-encoded as a
/// reverse delta: it is self-contained, and everything decoding through it stays within the
/// policy's caps once it is one step deeper (through its new delta and the new whole record).
/// A store whose records are a cache of a bucket's (`Store::fetches_records`) never re-encodes
/// one: the bucket would never get the re-encoded record and the cache could never drop it, so
/// there the new version is stored whole and the previous one stays as the bucket has it.
pub(super) fn reverse_allowed(
    store: &Store,
    meta: &MetaRead,
    policy: &DeltaPolicy,
    prev: &ObjectId,
    entry: &IndexEntry,
) -> Result<bool> {
    let budget = policy
        .max_restore_cost
        .map_or(u64::MAX, |c| (c * entry.content_len as f64) as u64);
    let (height, load) = chain_height(meta, prev)?;
    Ok(!store.fetches_records()
        && entry.base.is_none()
        && height < policy.max_depth
        && load + 2 * entry.stored_len <= budget)
}

/// The codec of a delta record made with `choice`.
pub(super) fn delta_codec(choice: &float::Choice) -> CodecTag {
    CodecTag::delta(choice.transform)
}

/// The parent's version of piece `i` when it is a tensor whose previous version has the same
/// header and is stored here: its id, index entry, and whether it is quantized.
pub(super) fn previous_object(
    meta: &MetaRead,
    previous: &Previous<'_>,
    input: &Input,
    i: usize,
) -> Result<Option<(ObjectId, IndexEntry, bool)>> {
    let info = &input.pieces[i];
    if !info.tensor {
        return Ok(None);
    }
    let Some(prev) = previous.get(&input.files[info.file].tree_path, &info.name) else {
        return Ok(None);
    };
    if prev.header != info.header {
        return Ok(None);
    }
    Ok(meta.object(&prev.id)?.map(|entry| {
        let quant = CodecTag::try_from(entry.codec).is_ok_and(|c| c.is_quant());
        (prev.id, entry, quant)
    }))
}

/// The longest chain of delta steps that ends at `base` (0 when nothing decodes through it),
/// and the most record bytes such a chain reads above `base`.
fn chain_height(meta: &MetaRead, base: &ObjectId) -> Result<(u32, u64)> {
    let (mut longest, mut load) = (0, 0);
    let mut frontier = vec![(*base, 0u32, 0u64)];
    while let Some((id, steps, bytes)) = frontier.pop() {
        longest = longest.max(steps);
        load = load.max(bytes);
        if steps >= mdl_store::MAX_CHAIN {
            break;
        }
        for d in meta.dependents(&id)? {
            let stored = meta.object(&d)?.map_or(0, |e| e.stored_len);
            frontier.push((d, steps + 1, bytes + stored));
        }
    }
    Ok((longest, load))
}

/// Whether a piece can be stored as a delta, or have one stored against it: a float tensor of
/// [`SMALL_DELTA`] bytes or more (one below `SMALL_TENSOR` is stored whole raw or zstd, as the
/// float codecs' tables outweigh their gain, but a masked delta of it may pay).
pub(super) fn is_delta_candidate(info: &Piece) -> bool {
    info.tensor && float::supports(info.header.dtype) && info.len >= SMALL_DELTA
}
