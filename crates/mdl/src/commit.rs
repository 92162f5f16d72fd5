//! `mdl commit`: store a safetensors checkpoint as a new commit on a branch.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use mdl_codec::engine::{Engine, FloatView, Kept};
use mdl_codec::float;
use mdl_codec::planes::Transform;
use mdl_codec::qrecord::QuantTensor;
use mdl_codec::quant::Correction;
use mdl_codec::scalar::lossy_supported;
use mdl_codec::{trim, CodecTag, EncodeOptions, SMALL_TENSOR};
use mdl_format::safetensors::{Layout, TensorInfo};
use mdl_format::{
    Commit, CommitStats, Entry, Exactness, Lossy, Manifest, ObjectId, ObjectKind, Ref, RefName,
    Timestamp,
};
use mdl_store::meta::MetaRead;
use mdl_store::{CommitSummary, IndexEntry, ObjectBatch, Placement, RefValue};
use serde::{Deserialize, Serialize};

use crate::input::Input;
use crate::lossy::{self, CodecMode, LossyRequest, LossySettings, SearchSummary, TensorPlan};
use crate::policy::{DeltaMode, DeltaPolicy};
use crate::rewrite::{chain, publish_rewrite, Rewrite};
use crate::{per_tensor, Error, Progress, Repository, Result};

/// What to commit and how.
#[derive(Clone, Debug, Default)]
pub struct CommitOptions {
    /// Commit message.
    pub message: String,
    /// Branch to commit onto (created at HEAD's commit if missing); HEAD's branch if `None`.
    pub branch: Option<RefName>,
    /// Training step.
    pub step: Option<u64>,
    /// Metrics, `name → value`; names must be unique.
    pub metrics: Vec<(String, f64)>,
    /// Author; `$MDL_AUTHOR`, then `$USER`, then "unknown" when `None`.
    pub author: Option<String>,
    /// Codec settings.
    pub encode: EncodeOptions,
    /// Delta policy; the repository's configuration when `None`.
    pub delta: Option<DeltaPolicy>,
    /// Lossy settings over the repository's configuration.
    pub lossy: LossyRequest,
}

/// What a commit did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CommitOutcome {
    /// The new commit.
    pub id: ObjectId,
    /// The branch it is on (short name).
    pub branch: String,
    /// Size of the committed file.
    pub raw_bytes: u64,
    /// Bytes of records added to the store.
    pub stored_bytes: u64,
    /// `raw_bytes / stored_bytes` (infinite when nothing new was stored; JSON null then).
    #[serde(deserialize_with = "null_is_infinite")]
    pub ratio: f64,
    /// Wall time.
    pub seconds: f64,
    /// Tensors in the checkpoint.
    pub tensors: u32,
    /// Tensors not already stored.
    pub new_tensors: u32,
    /// Tensors stored lossily.
    pub lossy_tensors: u32,
    /// The configuration search, for a lossy commit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub search: Option<SearchSummary>,
}

/// Commits the safetensors file at `path`.
#[tracing::instrument(name = "commit", skip_all, fields(path = %path.display()))]
pub fn commit(
    repo: &Repository,
    path: &Path,
    opts: &CommitOptions,
    progress: &dyn Progress,
) -> Result<CommitOutcome> {
    let started = Instant::now();
    let metrics = check_metrics(&opts.metrics)?;
    let input = Input::open(path)?;
    let store = repo.store();
    // From the first read of the parent to the ref update, no other writer of this process
    // (gc, compaction, another commit) may change what this commit builds on.
    let _writer = repo.writer();

    // Which ref moves, and from where.
    let head_branch = repo.head_branch()?;
    let target = match &opts.branch {
        Some(b) => Ref::branch(b).full(),
        None => head_branch.clone(),
    };
    let (expected, parent) = {
        let meta = store.meta().read()?;
        let current = meta.get_ref(&target)?;
        let parent = match &current {
            Some(v) => v.target(),
            // A new branch starts at HEAD's commit, if HEAD's branch has one.
            None => meta.get_ref(&head_branch)?.and_then(|v| v.target()),
        };
        (current, parent)
    };

    // Parent versions of each tensor, by name: the delta bases, and the previous lossy
    // configurations.
    let policy = opts
        .delta
        .map_or_else(|| DeltaPolicy::from_store(store), Ok)?;
    let parent_manifest = match parent {
        Some(p) => Some(repo.load_manifest(&repo.load_commit(&p)?.manifest)?),
        None => None,
    };
    let previous: HashMap<&str, &Entry> = parent_manifest
        .iter()
        .flat_map(|m| m.entries.iter().map(|e| (e.name.as_str(), e)))
        .collect();

    // Lossy settings, and for a lossy commit the configuration search.
    let settings = LossySettings::resolve(store, &opts.lossy)?;
    let engine = store.engine();
    let tensors = &input.layout.tensors;
    let correction = match training_step(opts, &input.layout) {
        Some(t) => Correction::adam(settings.betas.0, settings.betas.1, t),
        None => Correction { c1: 1.0, c2: 1.0 },
    };
    let (plans, search) = match settings.mode {
        CodecMode::Lossy => {
            let roles = lossy::roles(&input.layout, &settings);
            let previous_quant = |i: usize| -> Result<Option<QuantTensor>> {
                let meta = store.meta().read()?;
                match previous_object(&meta, &previous, &tensors[i])? {
                    Some((id, entry, true)) => Ok(Some(store.load_quant(&id, &entry)?)),
                    _ => Ok(None),
                }
            };
            let plan_input = lossy::PlanInput {
                engine,
                input: &input,
                roles: &roles,
                settings: &settings,
                previous: &previous,
                previous_quant: &previous_quant,
                correction,
                loss: loss_of(&metrics, &input.layout),
            };
            let evaluate = |plans: Option<&[Option<TensorPlan>]>| {
                evaluate_candidate(repo, path, &input, engine, correction, &settings, plans)
            };
            let eval: Option<lossy::Evaluate<'_>> =
                settings.eval_cmd.as_ref().map(|_| &evaluate as _);
            let (plans, summary) = lossy::plan(&plan_input, eval)?;
            (plans, Some(summary))
        }
        _ => (vec![None; tensors.len()], None),
    };
    let trim_bits = (settings.mode == CodecMode::Trim).then_some(settings.trim_bits);

    // Hash and store every tensor.
    let batch = store.batch();
    let ctx = StoreCtx {
        repo,
        batch: &batch,
        input: &input,
        previous: &previous,
        policy,
        encode: &opts.encode,
        claimed: Mutex::new(HashSet::new()),
        rewritten: Mutex::new(HashSet::new()),
        progress,
        engine,
        plans: &plans,
        trim_bits,
        correction,
    };
    progress.start("storing", input.bytes().len() as u64);
    let indices: Vec<usize> = (0..tensors.len()).collect();
    let results = per_tensor(&indices, |&i| tensors[i].len, |&i| ctx.store_tensor(i))?;
    progress.finish();
    let (results, exactness): (Vec<Stored>, Vec<Exactness>) = results.into_iter().unzip();
    let ids: Vec<ObjectId> = results.iter().map(|r| r.id).collect();
    let lossy_tensors = exactness.iter().filter(|e| e.is_lossy()).count() as u32;
    let mut added: Vec<(ObjectId, IndexEntry)> = Vec::new();
    let mut rewrites: Vec<Rewrite> = Vec::new();
    for r in results {
        added.extend(r.added);
        rewrites.extend(r.rewrite);
    }
    let new_tensors = added.len();

    let manifest = Manifest {
        header_json: input.header_json().to_vec(),
        metadata: {
            let mut m = input.layout.metadata.clone();
            m.sort();
            m
        },
        entries: tensors
            .iter()
            .zip(ids.iter().zip(exactness))
            .map(|(t, (id, exactness))| Entry {
                name: t.name.clone(),
                header: t.header.clone(),
                id: *id,
                exactness,
            })
            .collect(),
    };
    let manifest_bytes = manifest.encode();
    let manifest_id = ObjectId::hash(&manifest_bytes);
    if store.meta().read()?.object(&manifest_id)?.is_none() {
        let out = batch.put_blob(ObjectKind::Manifest, &manifest_bytes)?;
        added.push((out.id, out.entry));
    }
    // Bytes this commit adds to the store: new records, less what re-encoding saved.
    let stored_bytes = (added.iter().map(|(_, e)| e.stored_len).sum::<u64>()
        + rewrites.iter().map(|r| r.new.stored_len).sum::<u64>())
    .saturating_sub(rewrites.iter().map(|r| r.old.stored_len).sum::<u64>());
    let raw_bytes = input.bytes().len() as u64;
    let commit = Commit {
        manifest: manifest_id,
        parents: parent.into_iter().collect(),
        author: opts.author.clone().unwrap_or_else(default_author),
        time: Timestamp::now(),
        message: opts.message.clone(),
        step: opts.step,
        metrics,
        stats: CommitStats {
            raw_bytes,
            stored_bytes,
            tensors: tensors.len() as u32,
            new_tensors: new_tensors as u32,
            lossy_tensors,
        },
    };
    let commit_out = batch.put_blob(ObjectKind::Commit, &commit.encode())?;
    let id = commit_out.id;
    added.push((id, commit_out.entry));
    batch.finish()?;

    // Publish: index entries, commit index and the ref, in one transaction.
    let mut w = store.meta().write()?;
    for (oid, entry) in &added {
        w.put_object(oid, entry)?;
        // Stored again after a retention rule deleted it.
        w.remove_expired(oid)?;
        if let Some(base) = &entry.base {
            w.add_dependent(base, oid)?;
        }
    }
    for r in &rewrites {
        publish_rewrite(&mut w, r)?;
    }
    w.put_commit(&id, &CommitSummary::of(&commit))?;
    let summary = commit.message.lines().next().unwrap_or("");
    let reflog = if expected.is_none() {
        format!("commit (new branch): {summary}")
    } else {
        format!("commit: {summary}")
    };
    w.update_ref(
        &target,
        expected.as_ref(),
        Some(&RefValue::Direct(id)),
        &reflog,
    )?;
    w.commit_txn()?;
    for r in &rewrites {
        store.remove_record(&r.id, r.old.generation);
    }
    tracing::info!(%id, stored_bytes, new_tensors, "committed");

    Ok(CommitOutcome {
        id,
        branch: target.trim_start_matches(Ref::BRANCHES).to_string(),
        raw_bytes,
        stored_bytes,
        ratio: raw_bytes as f64 / stored_bytes.max(1) as f64,
        seconds: started.elapsed().as_secs_f64(),
        tensors: tensors.len() as u32,
        new_tensors: new_tensors as u32,
        lossy_tensors,
        search,
    })
}

/// The training step for Adam's bias corrections: `--step`, else the checkpoint's `step`
/// metadata.
fn training_step(opts: &CommitOptions, layout: &Layout) -> Option<u64> {
    opts.step.or_else(|| metadata_value(layout, "step"))
}

/// A number from the checkpoint's `__metadata__`.
fn metadata_value<T: std::str::FromStr>(layout: &Layout, key: &str) -> Option<T> {
    layout
        .metadata
        .iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
}

/// Names of the loss the quality bound is relative to, in order of preference.
const LOSS_NAMES: [&str; 3] = ["loss", "val_loss", "train_loss"];

/// The checkpoint's loss: a commit metric named `loss`, `val_loss` or `train_loss`, else the
/// same key in the safetensors metadata.
fn loss_of(metrics: &[(String, f64)], layout: &Layout) -> Option<f64> {
    LOSS_NAMES.iter().find_map(|name| {
        metrics
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| *v)
            .or_else(|| metadata_value(layout, name))
            .filter(|v: &f64| v.is_finite())
    })
}

/// Scores a candidate with the user's `--eval-cmd`: the committed file itself (`plans` =
/// `None`) or a copy with the planned tensors replaced by their reconstructions.
fn evaluate_candidate(
    repo: &Repository,
    path: &Path,
    input: &Input,
    engine: &dyn Engine,
    correction: Correction,
    settings: &LossySettings,
    plans: Option<&[Option<TensorPlan>]>,
) -> Result<f64> {
    let cmd = settings.eval_cmd.as_deref().unwrap_or_default();
    let Some(plans) = plans else {
        return lossy::run_eval(cmd, path);
    };
    // The candidate: the committed file with the planned tensors replaced by their
    // reconstructions, in a temporary file removed when this returns.
    let tmp = repo.store().scratch_file("eval-", ".safetensors")?;
    let out_err = |source| Error::Output {
        path: tmp.path().to_path_buf(),
        source,
    };
    let _interrupted = crate::interrupt::register(tmp.path());
    {
        use std::io::Write;
        let file = tmp.as_file();
        (&*file).write_all(input.bytes()).map_err(out_err)?;
        for (i, plan) in plans.iter().enumerate() {
            let Some(plan) = plan else { continue };
            let t = &input.layout.tensors[i];
            let q = lossy::quantize(
                engine,
                input.view(i),
                input.moments(plan.moments),
                plan,
                correction,
            );
            use std::os::unix::fs::FileExt;
            file.write_all_at(&q.render, input.layout.data_start() + t.offset)
                .map_err(out_err)?;
        }
    }
    lossy::run_eval(cmd, tmp.path())
}

/// Float tensors whose best float encoding saves less than this fraction also try zstd.
const FLOAT_GAIN_FLOOR: f64 = 0.03;

/// Re-encoding a previous version as a delta must save at least this fraction of its record.
const REWRITE_GAIN_FLOOR: f64 = 0.02;

/// One tensor's outcome.
struct Stored {
    id: ObjectId,
    /// Its new record, unless the repository already had the object.
    added: Option<(ObjectId, IndexEntry)>,
    /// The previous version, re-encoded against this one (reverse deltas).
    rewrite: Option<Rewrite>,
}

/// Everything the per-tensor work shares.
struct StoreCtx<'a> {
    repo: &'a Repository,
    batch: &'a ObjectBatch<'a>,
    input: &'a Input,
    previous: &'a HashMap<&'a str, &'a Entry>,
    policy: DeltaPolicy,
    encode: &'a EncodeOptions,
    /// Objects this commit is storing (a checkpoint may hold the same tensor twice).
    claimed: Mutex<HashSet<ObjectId>>,
    /// Objects this commit is re-encoding.
    rewritten: Mutex<HashSet<ObjectId>>,
    progress: &'a dyn Progress,
    /// Kernels of the lossy codecs.
    engine: &'a dyn Engine,
    /// How each tensor is quantized (`None`: not quantized).
    plans: &'a [Option<TensorPlan>],
    /// Mantissa bits kept, in trim mode.
    trim_bits: Option<u32>,
    /// Adam's bias corrections at this checkpoint's step.
    correction: Correction,
}

impl StoreCtx<'_> {
    /// Stores tensor `i`; also returns what the manifest says about it.
    fn store_tensor(&self, i: usize) -> Result<(Stored, Exactness)> {
        let info = &self.input.layout.tensors[i];
        // Work on a private copy: what is hashed is exactly what is encoded, even if the file
        // changes underneath the mapping.
        let mut data = self.input.tensor(i).to_vec();
        self.input.release(i);
        let mut exactness = Exactness::Lossless;
        let mut quantized = None;
        if let Some(plan) = &self.plans[i] {
            let w = FloatView {
                dtype: info.header.dtype,
                bytes: &data,
            };
            let moments = self.input.moments(plan.moments);
            let q = {
                // The quantizer reads the weights and moments several times: a GPU engine
                // copies them over once.
                let _kept: Vec<Kept<'_>> = std::iter::once(w.bytes)
                    .chain(moments.iter().flat_map(|mv| [mv.m.bytes, mv.v.bytes]))
                    .map(|b| self.engine.keep(b))
                    .collect();
                lossy::quantize(self.engine, w, moments, plan, self.correction)
            };
            exactness = Exactness::Lossy(q.lossy);
            data = q.render;
            quantized = Some(q.tensor);
        } else if let Some(bits) = self.trim_bits.filter(|_| {
            lossy_supported(info.header.dtype)
                && info.header.numel().unwrap_or(0) >= lossy::MIN_LOSSY_ELEMENTS
        }) {
            let mut out = vec![0u8; data.len()];
            trim::trim(info.header.dtype, &data, bits, &mut out);
            let view = |bytes| FloatView {
                dtype: info.header.dtype,
                bytes,
            };
            let err = self.engine.error_stats(view(&data), view(&out), None);
            exactness = Exactness::Lossy(Lossy {
                settings: format!("trim bits={bits} bound=2^-{bits}"),
                max_abs_error: err.max_abs,
                rel_error: err.rel_l2(),
                est_delta_loss: None,
            });
            data = out;
        }
        let mut hasher = info.header.hasher();
        hasher.update(&data);
        let id = hasher.finalize();
        let store = self.repo.store();
        let fresh = self.claimed.lock().unwrap().insert(id);
        let result = if !fresh || store.meta().read()?.object(&id)?.is_some() {
            Stored {
                id,
                added: None,
                rewrite: None,
            }
        } else if let Some(q) = &quantized {
            self.encode_quant(id, info, q)?
        } else {
            let whole = if exactness.is_lossy() {
                CodecTag::MantissaTrim
            } else {
                CodecTag::FloatSplit
            };
            self.encode_new(id, info, &data, whole)?
        };
        self.progress.advance(info.len);
        Ok((result, exactness))
    }

    /// Stores a quantized tensor: a quant-base, or a quant-delta against the previous version's
    /// codes (forward), or a quant-base with the previous version re-encoded against it
    /// (reverse).
    fn encode_quant(&self, id: ObjectId, info: &TensorInfo, q: &QuantTensor) -> Result<Stored> {
        let header = &info.header;
        let base_payload = q.encode_base();
        let store = self.repo.store();
        let put = |payload: &[u8], codec, placement| -> Result<IndexEntry> {
            Ok(self
                .batch
                .put_payload(&id, header, codec, placement, &[payload])?
                .entry)
        };
        let stored = |entry, rewrite| Stored {
            id,
            added: Some((id, entry)),
            rewrite,
        };
        let base = self.base_for(info, &id, true)?;
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
                let delta = q.encode_delta(self.engine, &prev.codes, prev.bins());
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
                let delta = prev.encode_delta(self.engine, &q.codes, q.bins());
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
                        .batch
                        .put_payload(&bid, header, CodecTag::QuantDelta, placement, &[&delta])?
                        .entry;
                    Some(Rewrite {
                        id: bid,
                        old: bentry,
                        new,
                    })
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
    fn base_for(
        &self,
        info: &TensorInfo,
        id: &ObjectId,
        quant: bool,
    ) -> Result<Option<(ObjectId, IndexEntry)>> {
        let meta = self.repo.store().meta().read()?;
        let Some((prev_id, entry, prev_quant)) = previous_object(&meta, self.previous, info)?
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
            // The previous version must be self-contained, and everything decoding through it
            // must stay within the caps once it is one step deeper (through its new delta and
            // the new whole record).
            DeltaMode::Reverse => {
                let (height, load) = chain_height(&meta, &prev_id)?;
                entry.base.is_none()
                    && height < self.policy.max_depth
                    && load + 2 * entry.stored_len <= budget
            }
        };
        Ok(allowed.then_some((prev_id, entry)))
    }

    /// Stores new tensor content with the lossless codecs; `whole` is the codec of a
    /// self-contained float record (float-split, or mantissa-trim for trimmed content).
    fn encode_new(
        &self,
        id: ObjectId,
        info: &TensorInfo,
        data: &[u8],
        whole: CodecTag,
    ) -> Result<Stored> {
        let header = &info.header;
        let len = data.len() as u64;
        let plain = |added| Stored {
            id,
            added: Some(added),
            rewrite: None,
        };
        if !float::supports(header.dtype) || len < SMALL_TENSOR {
            let out = self.batch.put_tensor(&id, header, data, self.encode)?;
            return Ok(plain((id, out.entry)));
        }
        let store = self.repo.store();
        let base = self.base_for(info, &id, false)?;
        let base_data = base
            .as_ref()
            .map(|(bid, be)| store.load_tensor(bid, be))
            .transpose()?;
        let encoder = |source| Error::Encode { id, source };
        // Analysis, encoding and a reverse re-encode all read these: a GPU engine copies each
        // over once.
        let _kept = (
            self.engine.keep(data),
            base_data.as_deref().map(|b| self.engine.keep(b)),
        );
        let analysis = float::analyze(self.engine, header.dtype, data, base_data.as_deref())
            .map_err(encoder)?;
        let delta = analysis.best_delta();
        let best_float = delta.map_or(analysis.plain.size, |d| d.size);
        if best_float as f64 > len as f64 * (1.0 - FLOAT_GAIN_FLOOR) {
            // The float codecs barely help (noise-like or repetitive data): let raw and zstd
            // compete instead.
            let out = self.batch.put_tensor(&id, header, data, self.encode)?;
            return Ok(plain((id, out.entry)));
        }
        // Writes the new tensor with a float choice, as a delta when given its base and depth.
        let write = |choice: &float::Choice, base: Option<(&ObjectId, &[u8], u32)>| {
            let payload =
                float::encode_pieces(self.engine, header.dtype, data, base.map(|b| b.1), choice)
                    .map_err(encoder)?;
            let (codec, placement) = match base {
                Some((bid, _, depth)) => (
                    delta_codec(choice),
                    Placement {
                        generation: 0,
                        base: Some(*bid),
                        depth,
                    },
                ),
                None => (whole, Placement::default()),
            };
            Ok::<_, Error>(
                self.batch
                    .put_payload(&id, header, codec, placement, &payload.pieces())?
                    .entry,
            )
        };
        // The best self-contained record: float-split unless it would not beat raw.
        let whole = || {
            if analysis.plain.size < len {
                write(&analysis.plain, None)
            } else {
                Ok(self.batch.put_tensor(&id, header, data, self.encode)?.entry)
            }
        };

        let (Some((bid, bentry)), Some(bdata), Some(delta)) = (base, base_data.as_deref(), delta)
        else {
            return Ok(plain((id, whole()?)));
        };
        match self.policy.mode {
            DeltaMode::Off => Ok(plain((id, whole()?))),
            DeltaMode::Forward => Ok(plain((
                id,
                write(delta, Some((&bid, bdata, bentry.depth + 1)))?,
            ))),
            DeltaMode::Reverse => {
                // The new tensor is the self-contained end of the chain.
                let entry = whole()?;
                let rewrite = self.reverse(&bid, &bentry, bdata, &id, data, info, delta)?;
                Ok(Stored {
                    id,
                    added: Some((id, entry)),
                    rewrite: rewrite.map(|(old, new)| Rewrite { id: bid, old, new }),
                })
            }
        }
    }

    /// Re-encodes the previous version `prev` (already checked by [`Self::base_for`]) as a delta
    /// against the new tensor, when that saves enough and no other tensor of this commit did.
    #[allow(clippy::too_many_arguments)]
    fn reverse(
        &self,
        prev: &ObjectId,
        prev_entry: &IndexEntry,
        prev_data: &[u8],
        id: &ObjectId,
        data: &[u8],
        info: &TensorInfo,
        estimate: &float::Choice,
    ) -> Result<Option<(IndexEntry, IndexEntry)>> {
        if estimate.size as f64 > prev_entry.stored_len as f64 * (1.0 - REWRITE_GAIN_FLOOR)
            || !self.rewritten.lock().unwrap().insert(*prev)
        {
            return Ok(None);
        }
        // XOR planes are symmetric; planes taken as they are must be coded from the previous
        // version's own bytes unless they are stored raw.
        let encoder = |source| Error::Encode { id: *prev, source };
        let choice = match estimate.transform {
            Transform::Planes if estimate.reusable_for_swap() => estimate.clone(),
            Transform::Planes => float::analyze_masked(
                self.engine,
                info.header.dtype,
                prev_data,
                data,
                estimate.xor_mask,
            )
            .map_err(encoder)?,
            // The difference changes sign with the roles, and its zigzag symbols with it.
            Transform::Sub => float::analyze_sub(self.engine, info.header.dtype, prev_data, data)
                .map_err(encoder)?,
        };
        if choice.size as f64 > prev_entry.stored_len as f64 * (1.0 - REWRITE_GAIN_FLOOR) {
            return Ok(None);
        }
        let payload = float::encode_pieces(
            self.engine,
            info.header.dtype,
            prev_data,
            Some(data),
            &choice,
        )
        .map_err(encoder)?;
        let placement = Placement {
            generation: prev_entry.generation + 1,
            base: Some(*id),
            depth: 1,
        };
        let new = self
            .batch
            .put_payload(
                prev,
                &info.header,
                delta_codec(&choice),
                placement,
                &payload.pieces(),
            )?
            .entry;
        Ok(Some((*prev_entry, new)))
    }
}

/// The codec of a delta record made with `choice`.
fn delta_codec(choice: &float::Choice) -> CodecTag {
    match choice.transform {
        Transform::Planes => CodecTag::XorDelta,
        Transform::Sub => CodecTag::SubDelta,
    }
}

/// The longest chain of delta steps that ends at `base` (0 when nothing decodes through it).
/// The parent's version of tensor `info` when it has the same header and is stored here: its
/// id, index entry, and whether it is quantized.
fn previous_object(
    meta: &MetaRead,
    previous: &HashMap<&str, &Entry>,
    info: &TensorInfo,
) -> Result<Option<(ObjectId, IndexEntry, bool)>> {
    let Some(prev) = previous.get(info.name.as_str()) else {
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

fn check_metrics(metrics: &[(String, f64)]) -> Result<Vec<(String, f64)>> {
    let mut out = metrics.to_vec();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    for w in out.windows(2) {
        if w[0].0 == w[1].0 {
            return Err(Error::InvalidMetric(w[0].0.clone()));
        }
    }
    if let Some((k, _)) = out
        .iter()
        .find(|(k, _)| k.is_empty() || k.chars().any(|c| c.is_control() || c == '='))
    {
        return Err(Error::InvalidMetric(k.clone()));
    }
    Ok(out)
}

/// The author of a commit that names none: `$MDL_AUTHOR`, then `$USER`, then "unknown".
pub fn default_author() -> String {
    std::env::var("MDL_AUTHOR")
        .or_else(|_| std::env::var("USER"))
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The commit index's entry for a commit.
/// Reads a ratio that JSON wrote as null (serde_json writes non-finite numbers so).
fn null_is_infinite<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
}
