//! `mdl commit`: store a checkpoint — a file or a tree of files — as a new commit on a branch.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mdl_codec::engine::Kept;
use mdl_codec::qrecord::QuantTensor;
use mdl_codec::quant::Correction;
use mdl_codec::EncodeOptions;
use mdl_format::{
    Commit, CommitStats, Entry, Exactness, Manifest, MomentPair, ObjectId, ObjectKind, PairSource,
    Ref, RefName, Region, Timestamp, TreeFile,
};
use mdl_store::meta::MetaWrite;
use mdl_store::{CommitSummary, IndexEntry, ObjectBatch, RefValue};

pub use mdl_protocol::outcome::CommitOutcome;

pub use crate::history::replay;
pub use crate::input::{tree_files, MemoryFile, OnDevice, SourceFile};
use crate::input::{Input, Piece, Run};
use crate::lossy::{self, CodecMode, LossyRequest, LossySettings, SearchSummary, TensorPlan};
use crate::policy::{DeltaMode, DeltaPolicy};
use crate::previous::Previous;
use crate::rewrite::{publish_rewrite, Rewrite};
use crate::warm::WarmTensors;
use crate::{per_tensor, Error, Progress, Repository, Result};
pub use mdl_codec::engine::DeviceCopy;

mod author;
mod coder;
mod content;
mod deferred;
mod eval;
mod large;
mod params;
mod spare;
mod staged;
mod store;

pub(crate) use author::author_soon;
pub use author::default_author;
use coder::Coder;
pub use deferred::{pending_deferred, run_deferred, writer_waiting, DeferredReport};
use eval::evaluate_candidate;
use spare::Spare;
pub use staged::{KnownPair, Ready, Staged};
use store::{previous_content, previous_object, StoreCtx, Stored};

/// What to commit and how.
#[derive(Clone, Debug, Default)]
pub struct CommitOptions {
    /// Commit message.
    pub message: String,
    /// Branch to commit onto (created at HEAD's commit if missing); HEAD's branch if `None`.
    pub branch: Option<RefName>,
    /// Training step; what the checkpoint records (`trainer_state.json`, safetensors
    /// metadata) when `None`.
    pub step: Option<u64>,
    /// Metrics, `name → value`; names must be unique. What the checkpoint records for its
    /// step when empty.
    pub metrics: Vec<(String, f64)>,
    /// Author; [`default_author`] when `None`.
    pub author: Option<String>,
    /// Codec settings.
    pub encode: EncodeOptions,
    /// Delta policy; the repository's configuration when `None`.
    pub delta: Option<DeltaPolicy>,
    /// Lossy settings over the repository's configuration.
    pub lossy: LossyRequest,
    /// What a process committing repeatedly keeps of its last commit: the parent's tensors are
    /// taken from here instead of being decoded again, and this commit's are kept for the next.
    pub warm: Option<Arc<WarmTensors>>,
}

/// Commits the file or directory at `path` (see [`commit_paths`]).
pub fn commit(
    repo: &Repository,
    path: &Path,
    opts: &CommitOptions,
    progress: &dyn Progress,
) -> Result<CommitOutcome> {
    commit_paths(repo, &[path.to_path_buf()], opts, progress)
}

/// Commits the files at `paths`: each a file (entered under its name) or a directory (its
/// files entered under their relative paths).
#[tracing::instrument(name = "commit", skip_all, fields(paths = paths.len()))]
pub fn commit_paths(
    repo: &Repository,
    paths: &[PathBuf],
    opts: &CommitOptions,
    progress: &dyn Progress,
) -> Result<CommitOutcome> {
    commit_staged(repo, Staged::paths(paths)?, opts, progress)
}

/// Commits what was staged.
pub fn commit_staged(
    repo: &Repository,
    staged: Staged,
    opts: &CommitOptions,
    progress: &dyn Progress,
) -> Result<CommitOutcome> {
    let metrics = check_metrics(&opts.metrics)?;
    if let Some(ready) = staged.ready {
        ready().map_err(|why| Error::Input {
            path: PathBuf::from("the staged state"),
            source: std::io::Error::other(why),
        })?;
    }
    commit_input(
        repo,
        staged.input,
        metrics,
        &staged.client,
        staged.started,
        opts,
        progress,
    )
}

/// Commits files given as bytes with the moment pairs the caller knows (see
/// [`Staged::memory`]).
pub fn commit_memory(
    repo: &Repository,
    files: Vec<MemoryFile>,
    pairs: &[KnownPair],
    opts: &CommitOptions,
    progress: &dyn Progress,
) -> Result<CommitOutcome> {
    commit_staged(repo, Staged::memory(files, pairs)?, opts, progress)
}

/// Commits the one file at `source` under the path `tree_path` (an upload, named by its
/// sender).
pub fn commit_file_as(
    repo: &Repository,
    source: &Path,
    tree_path: &str,
    opts: &CommitOptions,
    progress: &dyn Progress,
) -> Result<CommitOutcome> {
    let started = Instant::now();
    let metrics = check_metrics(&opts.metrics)?;
    let input = Input::open_as(source, tree_path)?;
    commit_input(repo, input, metrics, &[], started, opts, progress)
}

fn commit_input(
    repo: &Repository,
    input: Input,
    metrics: Vec<(String, f64)>,
    client: &[(usize, usize, usize)],
    started: Instant,
    opts: &CommitOptions,
    progress: &dyn Progress,
) -> Result<CommitOutcome> {
    let author = author_soon(opts);
    // What the checkpoint records of itself, where the user gave nothing.
    let step = opts.step.or_else(|| input.recorded_step());
    let metrics = if opts.metrics.is_empty() {
        check_metrics(&input.recorded_metrics())?
    } else {
        metrics
    };
    let store = repo.store();
    let warm = opts.warm.as_deref();
    if let Some(w) = warm {
        w.begin();
    }
    // From the first read of the parent to the ref update, no other writer of this process
    // (gc, compaction, another commit) may change what this commit builds on.
    let _writer = repo.writer();

    let target = Target::of(repo, opts.branch.as_ref())?;
    let parent = target.parent;

    // Parent versions of each tensor, by name: the delta bases, and the previous lossy
    // configurations.
    let policy = opts
        .delta
        .map_or_else(|| DeltaPolicy::from_store(store), Ok)?;
    let parent_manifest = match parent {
        Some(p) => Some(repo.load_manifest(&repo.load_commit(&p)?.manifest)?),
        None => None,
    };
    let previous = Previous::of(parent_manifest.as_ref());

    // Lossy settings, and for a lossy commit the configuration search.
    let settings = LossySettings::resolve(store, &opts.lossy)?;
    let engine = store.engine();
    // Bytes the caller already has on a GPU (CUDA state snapshotted there): an engine on
    // that GPU computes on them where they are.
    let _adopted: Vec<Kept<'_>> = input
        .device_copies()
        .map(|(bytes, copy)| engine.adopt(bytes, copy))
        .collect();
    let pieces = &input.pieces;
    let correction = Correction {
        curvature: settings.curvature,
        ..match step {
            Some(t) => Correction::adam(settings.betas.0, settings.betas.1, t),
            None => Correction::none(),
        }
    };
    // Which tensors are parameters and which their moments: recorded in the manifest, and
    // what a lossy commit's search prices its candidates with.
    let roles = lossy::roles(pieces, &settings, client);
    let (plans, search) = match settings.mode {
        CodecMode::Lossy => {
            // Each lookup's read transaction ends before the decode: a transaction held
            // across parallel work would keep this process's own publish waiting.
            let previous_quant = |i: usize| -> Result<Option<QuantTensor>> {
                let found = previous_object(&store.meta().read()?, &previous, &input, i)?;
                match found {
                    Some((id, entry, true)) => Ok(Some(store.load_quant(&id, &entry)?)),
                    _ => Ok(None),
                }
            };
            // Residual coding takes the previous version's decoded content as its reference,
            // while the chain through it stays within the policy's depth.
            let reference = |i: usize| -> Result<Option<lossy::Reference>> {
                if policy.mode == DeltaMode::Off {
                    return Ok(None);
                }
                let found = {
                    let meta = store.meta().read()?;
                    previous_object(&meta, &previous, &input, i)?
                };
                let Some((id, entry, _)) = found else {
                    return Ok(None);
                };
                if entry.depth + 1 > policy.max_depth {
                    return Ok(None);
                }
                Ok(Some(lossy::Reference {
                    id,
                    depth: entry.depth,
                    content: previous_content(store, warm, &id, &entry)?,
                }))
            };
            let plan_input = lossy::PlanInput {
                engine,
                input: &input,
                roles: &roles,
                settings: &settings,
                previous: &previous,
                previous_quant: &previous_quant,
                reference: &reference,
                correction,
                loss: loss_of(&metrics, &input),
            };
            let evaluate = |plans: Option<&[Option<TensorPlan>]>| {
                evaluate_candidate(repo, &input, engine, correction, &settings, plans)
            };
            let eval: Option<lossy::Evaluate<'_>> =
                settings.eval_cmd.as_ref().map(|_| &evaluate as _);
            let (plans, summary) = lossy::plan(&plan_input, eval)?;
            (plans, Some(summary))
        }
        _ => (vec![None; pieces.len()], None),
    };
    let trim_bits = (settings.mode == CodecMode::Trim).then_some(settings.trim_bits);

    // Hash and store every tensor.
    let batch = store.batch();
    let ctx = StoreCtx {
        repo,
        coder: Coder {
            repo,
            batch: &batch,
            engine,
        },
        input: &input,
        previous: &previous,
        policy,
        encode: &opts.encode,
        claimed: Mutex::new(HashSet::new()),
        rewritten: Mutex::new(HashSet::new()),
        deferred: AtomicBool::new(false),
        progress,
        plans: &plans,
        trim_bits,
        correction,
        warm,
        spare_tensors: Spare::new(),
        spare_planes: Spare::new(),
    };
    progress.start("storing", input.len());
    let indices: Vec<usize> = (0..pieces.len()).collect();
    let results = per_tensor(&indices, |&i| pieces[i].len, |&i| ctx.store_tensor(i))?;
    progress.finish();
    let deferred = ctx.deferred.load(Ordering::Relaxed);
    let (results, exactness): (Vec<Stored>, Vec<Exactness>) = results.into_iter().unzip();
    let ids: Vec<ObjectId> = results.iter().map(|r| r.id).collect();
    let lossy_tensors = exactness.iter().filter(|e| e.is_lossy()).count() as u32;
    let tensor_count = pieces.iter().filter(|p| p.tensor).count() as u32;
    let new_tensors = results
        .iter()
        .zip(pieces)
        .filter(|(r, p)| p.tensor && r.added.is_some())
        .count() as u32;
    let mut added: Vec<(ObjectId, IndexEntry)> = Vec::new();
    let mut rewrites: Vec<Rewrite> = Vec::new();
    for r in results {
        added.extend(r.added);
        rewrites.extend(r.rewrite);
    }

    let pairs = moment_pairs(&input, &roles, settings.pairings.len());
    let manifest = manifest_of(&input, &ids, exactness, pairs)?;
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
    let raw_bytes = input.len();
    let stats = CommitStats {
        raw_bytes,
        stored_bytes,
        tensors: tensor_count,
        new_tensors,
        lossy_tensors,
    };
    let commit = target.commit(manifest_id, author.get(), opts, step, metrics, stats);
    let id = store_commit(batch, &commit, &mut added)?;

    // Publish: index entries, commit index and the ref, in one transaction.
    let mut w = store.meta().write()?;
    index_records(&mut w, &added)?;
    for r in &rewrites {
        publish_rewrite(&mut w, r)?;
    }
    let branch = target.branch().to_string();
    target.publish(&mut w, &id, &commit)?;
    if deferred {
        w.push_pending(&id)?;
    }
    w.commit_txn()?;
    if let Some(kept) = warm {
        kept.publish();
    }
    for r in &rewrites {
        store.remove_record(&r.id, r.old.generation);
    }
    tracing::info!(%id, stored_bytes, new_tensors, "committed");

    Ok(outcome(id, branch, &commit.stats, started, search))
}

/// The outcome of commit `id` on `branch` with `stats`, started at `started`.
pub(crate) fn outcome(
    id: ObjectId,
    branch: String,
    stats: &CommitStats,
    started: Instant,
    search: Option<SearchSummary>,
) -> CommitOutcome {
    CommitOutcome {
        id,
        branch,
        raw_bytes: stats.raw_bytes,
        stored_bytes: stats.stored_bytes,
        ratio: stats.raw_bytes as f64 / stats.stored_bytes.max(1) as f64,
        seconds: started.elapsed().as_secs_f64(),
        tensors: stats.tensors,
        new_tensors: stats.new_tensors,
        lossy_tensors: stats.lossy_tensors,
        search,
    }
}

/// Writes `commit`'s record into `batch` (noting it in `added`) and finishes the batch; the
/// commit's id.
pub(crate) fn store_commit(
    batch: ObjectBatch<'_>,
    commit: &Commit,
    added: &mut Vec<(ObjectId, IndexEntry)>,
) -> Result<ObjectId> {
    let out = batch.put_blob(ObjectKind::Commit, &commit.encode())?;
    added.push((out.id, out.entry));
    batch.finish()?;
    Ok(out.id)
}

/// Indexes the records a commit added (in the caller's transaction).
pub(crate) fn index_records(w: &mut MetaWrite<'_>, added: &[(ObjectId, IndexEntry)]) -> Result<()> {
    for (oid, entry) in added {
        w.put_object(oid, entry)?;
        // Stored again after a retention rule deleted it.
        w.remove_expired(oid)?;
        if let Some(base) = &entry.base {
            w.add_dependent(base, oid)?;
        }
    }
    Ok(())
}

/// The branch a commit moves, and from where.
pub(crate) struct Target {
    /// The ref's full name.
    pub(crate) name: String,
    /// Its value now (`None`: the branch is new).
    pub(crate) expected: Option<RefValue>,
    /// The new commit's parent: the branch's commit, or for a new branch HEAD's commit (if
    /// HEAD's branch has one).
    pub(crate) parent: Option<ObjectId>,
}

impl Target {
    /// The target of a commit onto `branch` (HEAD's branch when `None`).
    pub(crate) fn of(repo: &Repository, branch: Option<&RefName>) -> Result<Target> {
        let head_branch = repo.head_branch()?;
        let name = match branch {
            Some(b) => Ref::branch(b).full(),
            None => head_branch.clone(),
        };
        let meta = repo.store().meta().read()?;
        let expected = meta.get_ref(&name)?;
        let parent = match &expected {
            Some(v) => v.target(),
            None => meta.get_ref(&head_branch)?.and_then(|v| v.target()),
        };
        Ok(Target {
            name,
            expected,
            parent,
        })
    }

    /// A new commit onto this target (its parent) by `author`.
    pub(crate) fn commit(
        &self,
        manifest: ObjectId,
        author: String,
        opts: &CommitOptions,
        step: Option<u64>,
        metrics: Vec<(String, f64)>,
        stats: CommitStats,
    ) -> Commit {
        Commit {
            manifest,
            parents: self.parent.into_iter().collect(),
            author,
            time: Timestamp::now(),
            message: opts.message.clone(),
            step,
            metrics,
            stats,
        }
    }

    /// The branch's short name.
    pub(crate) fn branch(&self) -> &str {
        self.name.trim_start_matches(Ref::BRANCHES)
    }

    /// Records `commit` (stored as `id`) in the commit index and moves the branch to it, in
    /// the caller's transaction; refused if the branch moved since [`Target::of`].
    pub(crate) fn publish(
        self,
        w: &mut MetaWrite<'_>,
        id: &ObjectId,
        commit: &Commit,
    ) -> Result<()> {
        w.put_commit(id, &CommitSummary::of(commit))?;
        let summary = commit.message.lines().next().unwrap_or("");
        let reflog = if self.expected.is_none() {
            format!("commit (new branch): {summary}")
        } else {
            format!("commit: {summary}")
        };
        w.update_ref(
            &self.name,
            self.expected.as_ref(),
            Some(&RefValue::Direct(*id)),
            &reflog,
        )?;
        Ok(())
    }
}

/// Names of the loss the quality bound is relative to, in order of preference.
const LOSS_NAMES: [&str; 3] = ["loss", "val_loss", "train_loss"];

/// The checkpoint's loss: a commit metric named `loss`, `val_loss` or `train_loss`, else the
/// same key in the checkpoint's metadata.
fn loss_of(metrics: &[(String, f64)], input: &Input) -> Option<f64> {
    LOSS_NAMES.iter().find_map(|name| {
        metrics
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| *v)
            .or_else(|| input.metadata_value(name))
            .filter(|v: &f64| v.is_finite())
    })
}

/// The moment pairs of `roles`, as indices into the manifest's tensors; family `patterns` (just
/// past the name patterns') is the optimizer order's, the next the client's.
fn moment_pairs(input: &Input, roles: &[lossy::Role], patterns: usize) -> Vec<MomentPair> {
    let mut tensor_index = Vec::with_capacity(input.pieces.len());
    let mut n = 0u32;
    for p in &input.pieces {
        tensor_index.push(n);
        n += u32::from(p.tensor);
    }
    roles
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match *r {
            lossy::Role::Param {
                family: Some(f),
                moments: Some((m, v)),
                ..
            } => Some(MomentPair {
                param: tensor_index[i],
                exp_avg: tensor_index[m],
                exp_avg_sq: tensor_index[v],
                source: match f.cmp(&patterns) {
                    std::cmp::Ordering::Less => PairSource::Names,
                    std::cmp::Ordering::Equal => PairSource::OptimizerOrder,
                    std::cmp::Ordering::Greater => PairSource::Client,
                },
            }),
            _ => None,
        })
        .collect()
}

/// The manifest of the tree in `input`, its pieces stored as `ids`.
fn manifest_of(
    input: &Input,
    ids: &[ObjectId],
    exactness: Vec<Exactness>,
    pairs: Vec<MomentPair>,
) -> Result<Manifest> {
    let mut exactness = exactness.into_iter().map(Some).collect::<Vec<_>>();
    let files = input
        .files
        .iter()
        .map(|f| {
            let regions = f
                .runs
                .iter()
                .map(|run| match *run {
                    Run::Inline { start, len } => {
                        Region::Inline(f.bytes()[start as usize..(start + len) as usize].to_vec())
                    }
                    Run::Object(i) => {
                        let p: &Piece = &input.pieces[i];
                        if p.tensor {
                            Region::Tensor(Entry {
                                name: p.name.clone(),
                                header: p.header.clone(),
                                id: ids[i],
                                exactness: exactness[i].take().expect("one region per piece"),
                            })
                        } else {
                            Region::Bytes {
                                id: ids[i],
                                len: p.len,
                            }
                        }
                    }
                })
                .collect();
            TreeFile {
                path: f.tree_path.clone(),
                format: f.format,
                executable: f.executable,
                note: f.note.clone(),
                metadata: f.metadata.clone(),
                regions,
            }
        })
        .collect();
    // The walk checked every path (and refused repeats) before anything was read.
    Ok(Manifest::new(files, pairs).expect("paths checked by the walk"))
}

pub(crate) fn check_metrics(metrics: &[(String, f64)]) -> Result<Vec<(String, f64)>> {
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
