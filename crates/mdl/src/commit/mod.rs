//! `mdl commit`: store a checkpoint — a file or a tree of files — as a new commit on a branch.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use mdl_codec::engine::Kept;
use mdl_codec::EncodeOptions;
use mdl_format::{
    Commit, CommitStats, Entry, Exactness, Manifest, MomentPair, ObjectId, ObjectKind, PairSource,
    Ref, RefName, Region, Timestamp, TreeFile,
};
use mdl_store::meta::{MetaWrite, HEAD};
use mdl_store::{CommitSummary, IndexEntry, ObjectBatch, RefValue};

pub use mdl_protocol::outcome::CommitOutcome;

pub use crate::history::replay;
pub use crate::input::{tree_files, MemoryFile, OnDevice, Reading, SourceFile};
use crate::input::{Input, Piece, Run};
use crate::lossy::betas::Betas;
use crate::lossy::{self, CodecMode, LossyRequest, LossySettings, SearchSummary, TensorPlan};
use crate::policy::{DeltaMode, DeltaPolicy};
use crate::previous::Previous;
use crate::rewrite::{publish_rewrite, Rewrite};
use crate::warm::WarmTensors;
use crate::{Error, Progress, Repository, Result};
pub use mdl_codec::engine::DeviceCopy;

mod deferred;
mod params;
mod phase;
mod plan;
mod provenance;
mod staged;
mod store;
mod update;

pub use deferred::{pending_deferred, run_deferred, writer_waiting, DeferredReport};
use phase::Phase;
use plan::{adam_betas, correction, lossy_plans, Planning};
pub(crate) use provenance::author_soon;
use provenance::source_soon;
pub use provenance::{default_author, source_properties};
pub use staged::{KnownPair, Ready, Staged};
use store::coder::Coder;
use store::spare::Spare;
use store::{cast_pairs, Made, StoreCtx, Stored};
pub(crate) use update::union;

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
    /// How files are read: symlinks that leave a folder, files that look like checkpoints
    /// but do not parse.
    pub reading: Reading,
    /// Take no step or metrics from what the files record (`trainer_state.json`, safetensors
    /// metadata) when none are given: a merge's files are its first commit's, their record
    /// not the merge's.
    pub ignore_recorded: bool,
    /// Parents after the branch's commit: the other commits of a merge, in order (one that
    /// is the branch's commit is not repeated).
    pub merged: Vec<ObjectId>,
    /// Commit the branch's tree with the input's files added or replacing theirs and these
    /// paths (files, or folders with everything under them) removed, instead of the input as
    /// the whole tree: an upload through the Hugging Face API. `None`: the input is the tree.
    pub update: Option<Vec<String>>,
    /// The training code's folder: the git commit of the work tree holding it, and whether it
    /// had changes, are recorded (`source.git`, `source.dirty`; nothing outside a work tree).
    /// `None`: nothing is looked up (a server's commits, a merge).
    pub source: Option<PathBuf>,
    /// Named facts recorded with the commit ([`Commit::properties`]), in any order, names
    /// unique (set by mdl itself: a merge, the training code's git commit).
    pub properties: Vec<(String, String)>,
    /// `branch` is a tool's working branch (a sharded save's part branch, deleted once the
    /// save is assembled): HEAD never follows it, even to a new repository's first branch.
    pub working: bool,
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
    commit_staged(repo, Staged::read(paths, opts.reading)?, opts, progress)
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
    let input = Input::open_as(source, tree_path, opts.reading.as_bytes)?;
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
    let prepare = Phase::start("prepare");
    let author = author_soon(opts);
    let source = source_soon(opts.source.as_ref());
    // What the checkpoint records of itself, where the user gave nothing.
    let step = opts.step.or_else(|| {
        (!opts.ignore_recorded)
            .then(|| input.recorded_step())
            .flatten()
    });
    let metrics = if opts.metrics.is_empty() && !opts.ignore_recorded {
        check_metrics(&input.recorded_metrics())?
    } else {
        metrics
    };
    crate::limits::check(repo, &input)?;
    let _bookkeeping = crate::limits::reserve_commit(&input)?;
    let store = repo.store();
    let warm = opts.warm.as_deref();
    if let Some(w) = warm {
        w.begin();
    }
    // From the first read of the parent to the ref update, no other writer of this process
    // (gc, compaction, another commit) may change what this commit builds on.
    let _writer = repo.writer();

    let target = Target::of(repo, opts.branch.as_ref(), !opts.working)?;
    // Parent versions of each tensor, by name: the delta bases, and the previous lossy
    // configurations.
    let policy = opts
        .delta
        .map_or_else(|| DeltaPolicy::from_store(store), Ok)?;
    let parent = match target.parent {
        Some(p) => Some(repo.load_commit(&p)?),
        None => None,
    };
    let parent_manifest = match &parent {
        Some(c) => Some(repo.load_manifest(&c.manifest)?),
        None => None,
    };
    let previous = Previous::of(parent_manifest.as_ref());
    let settings = LossySettings::resolve(store, &opts.lossy)?;
    // Bytes the caller already has on a GPU (CUDA state snapshotted there): an engine on
    // that GPU computes on them where they are.
    let _adopted: Vec<Kept<'_>> = input
        .device_copies()
        .map(|(bytes, copy)| store.engine().adopt(bytes, copy))
        .collect();
    // Which tensors are parameters and which their moments: recorded in the manifest, and
    // what a lossy commit's search prices its candidates with.
    let roles = lossy::roles(&input.pieces, &settings, client);
    // A 16-bit copy of an fp32 master is stored as its cast: a lossy commit prices and
    // quantizes the master alone.
    let casts = cast_pairs(&input, &roles);
    let plan_roles: Vec<lossy::Role> = (roles.iter().zip(&casts))
        .map(|(r, c)| match c {
            Some(_) => lossy::Role::Exact,
            None => *r,
        })
        .collect();
    let mut planning = Planning {
        repo,
        input: &input,
        roles: &plan_roles,
        casts: &casts,
        settings: &settings,
        previous: &previous,
        policy,
        warm,
        correction: correction(&settings, &Betas::default(), step),
        betas: None,
        decoded: Default::default(),
        metrics: &metrics,
    };
    if settings.mode == CodecMode::Lossy {
        let (betas, decoded) = adam_betas(&planning, step, parent.as_ref().and_then(|c| c.step))?;
        planning.correction = correction(&settings, &betas, step);
        planning.betas = Some(betas);
        planning.decoded = decoded;
    }
    let (plans, mut search) = lossy_plans(&planning)?;
    // The betas matter where parameters were priced with their moments.
    if let (Some(s), Some(b)) = (search.as_mut(), &planning.betas) {
        s.adam_betas = (s.priced > 0).then(|| b.describe());
    }

    drop(prepare);
    let batch = store.batch();
    // A commit that fails from here on (a full disk) takes its records back before it lets
    // go of the writer.
    let unpublished = batch.unpublished();
    let mut stored = {
        let _phase = Phase::start("tensors");
        store_tensors(&planning, &plans, &batch, &opts.encode, progress)?
    };
    let records = Phase::start("manifest and commit records");
    let pairs = moment_pairs(&input, &roles, settings.pairings.len());
    let manifest = manifest_of(
        &input,
        &stored.ids,
        std::mem::take(&mut stored.exactness),
        pairs,
    )?;
    let (manifest, raw_bytes, tensors) = match &opts.update {
        // The whole tree's size and tensors, as for any commit.
        Some(deleted) => {
            let tree = update::overlay(
                manifest,
                parent_manifest.as_ref(),
                &target
                    .parent
                    .map_or_else(|| target.branch().to_string(), |p| p.short(12)),
                deleted,
            )?;
            let (len, tensors) = (
                tree.files.iter().map(|f| f.len()).sum(),
                tree.tensors().count(),
            );
            (tree, len, tensors as u32)
        }
        None => {
            let tensors = input.pieces.iter().filter(|p| p.tensor).count() as u32;
            (manifest, input.len(), tensors)
        }
    };
    // Every byte is read: a file written meanwhile is refused before anything names it.
    input.check_unchanged()?;
    let manifest_id = put_manifest(repo, &batch, &manifest, &mut stored.added)?;
    let stats = CommitStats {
        raw_bytes,
        stored_bytes: stored_bytes(&stored.added, &stored.rewrites),
        tensors,
        new_tensors: stored.new_tensors,
        lossy_tensors: stored.lossy_tensors,
    };
    let mut commit = target.commit(manifest_id, author.get(), opts, step, metrics, stats);
    if opts.source.is_some() {
        commit.properties.extend(source.get().unwrap_or_default());
        commit.properties.sort();
    }
    let id = store_commit(batch, &commit, &mut stored.added)?;
    drop(records);
    let branch = target.branch().to_string();
    {
        let _phase = Phase::start("publish");
        publish(repo, target, &id, &commit, &stored, warm)?;
    }
    unpublished.published();
    let CommitStats {
        stored_bytes,
        new_tensors,
        ..
    } = commit.stats;
    tracing::info!(%id, stored_bytes, new_tensors, "committed");
    Ok(outcome(id, branch, &commit.stats, started, search))
}

/// What storing a commit's tensors gave: each file's object, how each was stored, and what
/// the commit adds to the store and to its index.
struct Tensors {
    ids: Vec<ObjectId>,
    exactness: Vec<Exactness>,
    /// New records, to index when the commit is published.
    added: Vec<(ObjectId, IndexEntry)>,
    /// Earlier records re-encoded as deltas against this commit's tensors.
    rewrites: Vec<Rewrite>,
    new_tensors: u32,
    lossy_tensors: u32,
    /// Whether some tensor's encoding was left to the background (see `deferred.rs`).
    deferred: bool,
}

/// Hashes and stores every tensor of the input, in parallel, into `batch`.
fn store_tensors(
    planning: &Planning<'_>,
    plans: &[Option<TensorPlan>],
    batch: &ObjectBatch<'_>,
    encode: &EncodeOptions,
    progress: &dyn Progress,
) -> Result<Tensors> {
    let Planning { repo, input, .. } = *planning;
    let settings = planning.settings;
    let ctx = StoreCtx {
        repo,
        coder: Coder {
            repo,
            batch,
            engine: repo.store().engine(),
        },
        input,
        previous: planning.previous,
        policy: planning.policy,
        encode,
        claimed: Mutex::new(HashSet::new()),
        rewritten: Mutex::new(HashSet::new()),
        deferred: AtomicBool::new(false),
        progress,
        plans,
        trim_bits: (settings.mode == CodecMode::Trim).then_some(settings.trim_bits),
        correction: planning.correction,
        betas_words: planning.betas.as_ref().map(Betas::words),
        warm: planning
            .warm
            .filter(|_| next_commit_reads(settings.mode, &planning.policy)),
        repeated: match planning.warm {
            Some(_) => planning.previous.repeated(),
            None => HashSet::new(),
        },
        keep_tips: settings.tips,
        spare_tensors: Spare::new(),
        spare_planes: Spare::new(),
        made: Made::default(),
        casts: planning.casts,
        followed: (planning.casts.iter().flatten().copied())
            .chain(plans.iter().flatten().filter_map(TensorPlan::follows))
            .collect(),
        kept: Default::default(),
        resolved: (plans.iter().enumerate())
            .filter(|(_, p)| p.as_ref().and_then(TensorPlan::follows).is_some())
            .map(|(i, _)| (i, OnceLock::new()))
            .collect(),
    };
    let pieces = &input.pieces;
    progress.start("storing", input.len());
    let results = ctx.store_all()?;
    progress.finish();
    let (results, exactness): (Vec<Stored>, Vec<Exactness>) = results.into_iter().unzip();
    let mut out = Tensors {
        ids: results.iter().map(|r| r.id).collect(),
        lossy_tensors: exactness.iter().filter(|e| e.is_lossy()).count() as u32,
        exactness,
        new_tensors: results
            .iter()
            .zip(pieces)
            .filter(|(r, p)| p.tensor && r.added.is_some())
            .count() as u32,
        added: Vec::new(),
        rewrites: Vec::new(),
        deferred: ctx.deferred.load(Ordering::Relaxed),
    };
    for r in results {
        out.added.extend(r.added);
        out.rewrites.extend(r.rewrite.map(|r| *r));
    }
    Ok(out)
}

/// Whether the next commit reads this one's tensors while it is stored, so that a committer
/// keeps them (its warm cache): a lossy commit's residuals are taken against them, and so are
/// eager deltas. Deferred reverse deltas are taken after the commit, by a re-encode that
/// decodes the version it needs; keeping a copy of every tensor for it cost a committer more
/// time and memory than the decode it spares (docs/DECISIONS.md).
fn next_commit_reads(mode: CodecMode, policy: &DeltaPolicy) -> bool {
    mode == CodecMode::Lossy
        || match policy.mode {
            DeltaMode::Forward => true,
            DeltaMode::Reverse => !policy.defer,
            DeltaMode::Off => false,
        }
}

/// Stores `manifest` unless the store has it already; returns its id.
fn put_manifest(
    repo: &Repository,
    batch: &ObjectBatch<'_>,
    manifest: &Manifest,
    added: &mut Vec<(ObjectId, IndexEntry)>,
) -> Result<ObjectId> {
    let bytes = manifest.encode();
    let id = ObjectId::hash(&bytes);
    if repo.store().meta().read()?.object(&id)?.is_none() {
        let out = batch.put_blob(ObjectKind::Manifest, &bytes)?;
        added.push((out.id, out.entry));
    }
    Ok(id)
}

/// Bytes a commit adds to the store: its new records, less what re-encoding saved.
fn stored_bytes(added: &[(ObjectId, IndexEntry)], rewrites: &[Rewrite]) -> u64 {
    (added.iter().map(|(_, e)| e.stored_len).sum::<u64>()
        + rewrites.iter().map(|r| r.new.stored_len).sum::<u64>())
    .saturating_sub(rewrites.iter().map(|r| r.old.stored_len).sum::<u64>())
}

/// Publishes commit `id`: its records' index entries, the rewrites, the commit index and the
/// ref, in one transaction; then drops the records the rewrites replaced.
fn publish(
    repo: &Repository,
    target: Target,
    id: &ObjectId,
    commit: &Commit,
    stored: &Tensors,
    warm: Option<&WarmTensors>,
) -> Result<()> {
    let store = repo.store();
    let mut w = store.meta().write()?;
    index_records(&mut w, &stored.added)?;
    for r in &stored.rewrites {
        publish_rewrite(&mut w, r)?;
    }
    target.publish(&mut w, id, commit)?;
    if stored.deferred {
        w.push_pending(id)?;
    }
    w.commit_txn()?;
    if let Some(kept) = warm {
        kept.publish();
    }
    for r in &stored.rewrites {
        store.remove_record(&r.id, r.old.generation);
    }
    Ok(())
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
    /// HEAD's branch, when this is a new repository's first commit and goes to another branch:
    /// HEAD then follows it, so that `log`, `show` and the web view show the history without a
    /// switch (docs/DECISIONS.md).
    first_from: Option<String>,
}

impl Target {
    /// The target of a commit onto `branch` (HEAD's branch when `None`); `follow`: HEAD may
    /// follow it, when it is a new repository's first branch.
    pub(crate) fn of(repo: &Repository, branch: Option<&RefName>, follow: bool) -> Result<Target> {
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
        let first = follow
            && expected.is_none()
            && name != head_branch
            && meta.refs(Ref::BRANCHES)?.is_empty();
        Ok(Target {
            name,
            expected,
            parent,
            first_from: first.then_some(head_branch),
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
        let mut parents: Vec<ObjectId> = self.parent.into_iter().collect();
        for m in &opts.merged {
            if !parents.contains(m) {
                parents.push(*m);
            }
        }
        let mut properties = opts.properties.clone();
        properties.sort();
        debug_assert!(properties.windows(2).all(|w| w[0].0 != w[1].0));
        Commit {
            manifest,
            parents,
            author,
            time: Timestamp::now(),
            message: opts.message.clone(),
            step,
            metrics,
            stats,
            properties,
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
        if let Some(from) = self.first_from {
            // Unless HEAD was switched meanwhile (then it stays where it was put).
            let head = Some(RefValue::Symbolic(from.clone()));
            if w.get_ref(HEAD)? == head && w.get_ref(&from)?.is_none() {
                let branch = self.name.trim_start_matches(Ref::BRANCHES);
                w.update_ref(
                    HEAD,
                    head.as_ref(),
                    Some(&RefValue::Symbolic(self.name.clone())),
                    &format!("commit: HEAD follows {branch}, the repository's first branch"),
                )?;
            }
        }
        Ok(())
    }
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
                    Run::Inline { start, len } => Region::Inline(f.range(start, len).to_vec()),
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
