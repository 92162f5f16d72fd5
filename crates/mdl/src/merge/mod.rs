//! `mdl merge`: one checkpoint made from several commits tensor by tensor — a model soup
//! (`linear`), task arithmetic or TIES over a base — committed with every merged commit as a
//! parent and the strategy recorded in the commit's properties.
//!
//! The merged tree is the first commit's: its files in its layout, each float tensor that
//! differs between the commits replaced by the combination (computed in fp32, or fp64 for
//! fp64 tensors, and rounded back to the tensor's dtype to nearest, ties to even); tensors
//! identical in every commit (and the base) and everything that is not a float tensor are taken
//! from the first commit as they are. Optimizer and scheduler state is left out unless asked
//! for; asked for, moments are averaged linearly whatever the strategy (a sum of second moments
//! is not one). The new commit goes through the ordinary commit path, so unchanged tensors
//! deduplicate and changed ones delta against the branch's commit.

mod combine;

use std::collections::{HashMap, HashSet};

use mdl_format::{Dtype, ObjectId};

use crate::checkout::{layout, FileLayout, Layout, Piece, Placed};
use crate::commit::{self, CommitOptions, CommitOutcome, MemoryFile};
use crate::{revision, Error, Progress, Repository, Result};
pub use combine::{combine, Strategy};

/// How to merge.
#[derive(Clone, Debug)]
pub struct MergeOptions {
    /// The combination.
    pub strategy: Strategy,
    /// One weight per commit, in order; `None`: equal weights for `linear` (normalized to sum
    /// to one), 1 each for `task-arithmetic` and `ties`.
    pub weights: Option<Vec<f64>>,
    /// The base of `task-arithmetic` and `ties`; the commits' nearest common ancestor when
    /// `None`.
    pub base: Option<String>,
    /// Merge optimizer and scheduler state too (averaged linearly) instead of leaving it out.
    pub optimizer: bool,
}

/// What a merge did (as `mdl merge --json` prints it).
#[derive(Clone, Debug, serde::Serialize)]
pub struct MergeOutcome {
    /// The new commit.
    pub commit: CommitOutcome,
    /// The commits merged, in order.
    pub merged: Vec<ObjectId>,
    /// The base, for the strategies that have one.
    pub base: Option<ObjectId>,
    /// Tensors computed from the commits.
    pub computed: usize,
    /// Tensors identical everywhere, taken as they are.
    pub identical: usize,
    /// Tensors taken from the first commit: not floats, or missing from another commit.
    pub from_first: Vec<String>,
    /// Files left out (optimizer and scheduler state).
    pub left_out: Vec<String>,
}

/// Merges the commits `revs` (at least two distinct) into a new commit on `commit.branch` (HEAD's
/// branch when `None`), whose parents are that branch's commit and then each merged commit.
/// `commit.message` empty: a message naming the commits and the strategy.
pub fn merge(
    repo: &Repository,
    revs: &[String],
    opts: &MergeOptions,
    commit: &CommitOptions,
    progress: &dyn Progress,
) -> Result<MergeOutcome> {
    let bad = |why: String| Error::Merge(why);
    let mut merged = Vec::new();
    for rev in revs {
        let id = revision::resolve(repo, rev)?;
        if merged.contains(&id) {
            return Err(bad(format!(
                "{rev} is the same commit as another one named"
            )));
        }
        merged.push(id);
    }
    if merged.len() < 2 {
        return Err(bad("give at least two branches or commits to merge".into()));
    }
    let weights = match &opts.weights {
        Some(w) if w.len() != merged.len() => {
            return Err(bad(format!(
                "{} weights for {} commits: give one for each",
                w.len(),
                merged.len()
            )))
        }
        Some(w) => w.clone(),
        None if opts.strategy == Strategy::Linear => vec![1.0 / merged.len() as f64; merged.len()],
        None => vec![1.0; merged.len()],
    };
    combine::check(&opts.strategy, &weights).map_err(bad)?;
    let base = if opts.strategy.has_base() {
        Some(match &opts.base {
            Some(rev) => revision::resolve(repo, rev)?,
            None => common_ancestor(repo, &merged)?.ok_or_else(|| {
                bad(format!(
                    "{} has no base: the commits share no ancestor (give one with --base)",
                    opts.strategy
                ))
            })?,
        })
    } else {
        None
    };

    let layouts = merged
        .iter()
        .map(|id| layout(repo, &id.to_hex()))
        .collect::<Result<Vec<_>>>()?;
    let base_layout = base.map(|id| layout(repo, &id.to_hex())).transpose()?;
    let moments = moment_names(repo, &merged)?;

    let mut counts = Counts::default();
    let mut files = Vec::new();
    for file in &layouts[0].files {
        if !opts.optimizer && is_training_state(&file.path) {
            counts.left_out.push(file.path.clone());
            continue;
        }
        let bytes = merge_file(
            repo,
            file,
            &layouts,
            base_layout.as_ref(),
            &moments,
            &opts.strategy,
            &weights,
            &mut counts,
        )?;
        files.push(MemoryFile::new(file.path.clone(), bytes));
    }
    if files.is_empty() {
        return Err(bad(
            "nothing is left to commit once the optimizer state is left out".into(),
        ));
    }

    let mut opts_commit = commit.clone();
    opts_commit.merged = merged.clone();
    opts_commit.ignore_recorded = true;
    opts_commit.properties = properties(revs, opts, &weights, base, &counts);
    if opts_commit.message.is_empty() {
        opts_commit.message = format!("merge {} ({})", revs.join(", "), opts.strategy);
    }
    let commit = commit::commit_memory(repo, files, &[], &opts_commit, progress)?;
    Ok(MergeOutcome {
        commit,
        merged,
        base,
        computed: counts.computed,
        identical: counts.identical,
        from_first: counts.from_first,
        left_out: counts.left_out,
    })
}

/// What became of each tensor and file, as [`MergeOutcome`] reports it.
#[derive(Default)]
struct Counts {
    computed: usize,
    /// Of those, optimizer moments (averaged linearly).
    moments: usize,
    identical: usize,
    from_first: Vec<String>,
    left_out: Vec<String>,
}

/// Files of training state a merged model does not carry: the optimizer's, the scheduler's
/// and the random generators' (as `transformers`, Lightning and mdl's own state name them).
pub fn is_training_state(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    ["optimizer", "scheduler", "rng_state"]
        .iter()
        .any(|p| name.starts_with(p))
}

/// The merged bytes of `file` (a file of the first commit).
#[allow(clippy::too_many_arguments)]
fn merge_file(
    repo: &Repository,
    file: &FileLayout,
    layouts: &[Layout],
    base: Option<&Layout>,
    moments: &HashSet<(String, String)>,
    strategy: &Strategy,
    weights: &[f64],
    counts: &mut Counts,
) -> Result<Vec<u8>> {
    enum Job<'a> {
        Take(&'a Placed),
        Compute {
            parts: Vec<&'a Placed>,
            base: Option<&'a Placed>,
            moment: bool,
        },
    }
    let mut out = vec![0u8; file.len as usize];
    let mut jobs = Vec::new();
    for piece in &file.pieces {
        let placed = match piece {
            Piece::Inline { offset, bytes } => {
                out[*offset as usize..][..bytes.len()].copy_from_slice(bytes);
                continue;
            }
            Piece::Object(p) => p,
        };
        if !placed.tensor {
            jobs.push((placed.offset, Job::Take(placed)));
            continue;
        }
        let parts: Option<Vec<&Placed>> = layouts
            .iter()
            .map(|l| counterpart(l, layouts, &file.path).and_then(|f| f.tensor(&placed.name)))
            .collect();
        let Some(parts) = parts else {
            counts
                .from_first
                .push(format!("{}:{}", file.path, placed.name));
            jobs.push((placed.offset, Job::Take(placed)));
            continue;
        };
        for (i, p) in parts.iter().enumerate().skip(1) {
            if p.header != placed.header {
                return Err(Error::Merge(format!(
                    "tensor {} of {} is {} in the first commit and {} in commit {}: only tensors of one dtype and shape merge",
                    placed.name, file.path, show_header(placed), show_header(p), i + 1
                )));
            }
        }
        let moment = moments.contains(&(file.path.clone(), placed.name.clone()));
        let base_part = match base {
            Some(b) if !moment => {
                counterpart(b, layouts, &file.path).and_then(|f| f.tensor(&placed.name))
            }
            _ => None,
        };
        let same = parts.iter().all(|p| p.id == placed.id);
        let uses_base = strategy.has_base() && !moment;
        if same && (!uses_base || base_part.is_some_and(|b| b.id == placed.id)) {
            counts.identical += 1;
            jobs.push((placed.offset, Job::Take(placed)));
        } else if !is_float(placed.header.dtype) {
            counts
                .from_first
                .push(format!("{}:{}", file.path, placed.name));
            jobs.push((placed.offset, Job::Take(placed)));
        } else if uses_base && base_part.is_none_or(|b| b.header != placed.header) {
            return Err(Error::Merge(format!(
                "tensor {} of {} is not in the base with that dtype and shape; {} needs it there",
                placed.name, file.path, strategy
            )));
        } else {
            counts.computed += 1;
            counts.moments += usize::from(moment);
            jobs.push((
                placed.offset,
                Job::Compute {
                    parts,
                    base: base_part,
                    moment,
                },
            ));
        }
    }
    let linear = Strategy::Linear;
    let results = crate::per_tensor(
        &jobs,
        |(_, j)| match j {
            Job::Take(p) => p.entry.content_len,
            Job::Compute { parts, .. } => parts[0].entry.content_len * (parts.len() as u64 + 1),
        },
        |(offset, job)| {
            let bytes = match job {
                Job::Take(p) => p.load(repo)?,
                Job::Compute {
                    parts,
                    base,
                    moment,
                } => {
                    let inputs = parts
                        .iter()
                        .map(|p| p.load(repo))
                        .collect::<Result<Vec<_>>>()?;
                    let base = base.map(|b| b.load(repo)).transpose()?;
                    let strategy = if *moment { &linear } else { strategy };
                    combine(
                        parts[0].header.dtype,
                        strategy,
                        weights,
                        base.as_deref(),
                        &inputs,
                    )
                }
            };
            Ok((*offset, bytes))
        },
    )?;
    for (offset, bytes) in results {
        out[offset as usize..][..bytes.len()].copy_from_slice(&bytes);
    }
    Ok(out)
}

/// The file of `layout` that merges with the first commit's file at `path`: the file at that
/// path, or, when both commits are a single file (committed under their own names,
/// `a.safetensors` and `b.safetensors`), that file.
fn counterpart<'a>(layout: &'a Layout, layouts: &[Layout], path: &str) -> Option<&'a FileLayout> {
    layout
        .file(path)
        .or_else(|| match (layout.single(), layouts[0].single()) {
            (Some(f), Some(_)) => Some(f),
            _ => None,
        })
}

fn show_header(p: &Placed) -> String {
    format!("{:?} {:?}", p.header.dtype, p.header.shape)
}

/// Whether merging computes on this dtype (the others are taken from the first commit).
pub fn is_float(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64)
}

/// The optimizer moments of each commit, by file and tensor name (what the manifests pair).
fn moment_names(repo: &Repository, commits: &[ObjectId]) -> Result<HashSet<(String, String)>> {
    let mut out = HashSet::new();
    for id in commits {
        let manifest = repo.load_manifest(&repo.load_commit(id)?.manifest)?;
        let names: Vec<(String, String)> = manifest
            .tensors()
            .map(|(f, e)| (manifest.files[f].path.clone(), e.name.clone()))
            .collect();
        for p in &manifest.pairs {
            for i in [p.exp_avg, p.exp_avg_sq] {
                if let Some(n) = names.get(i as usize) {
                    out.insert(n.clone());
                }
            }
        }
    }
    Ok(out)
}

/// The nearest commit that every one of `commits` descends from (the first found walking back
/// from the first commit, newest first), if any.
pub fn common_ancestor(repo: &Repository, commits: &[ObjectId]) -> Result<Option<ObjectId>> {
    let reach = commits[1..]
        .iter()
        .map(|c| {
            crate::transfer::reachable_commits(repo, &[*c])
                .map(|v| v.into_iter().collect::<HashSet<_>>())
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(crate::transfer::reachable_commits(repo, &commits[..1])?
        .into_iter()
        .find(|id| reach.iter().all(|r| r.contains(id))))
}

/// What the commit records of the merge.
fn properties(
    revs: &[String],
    opts: &MergeOptions,
    weights: &[f64],
    base: Option<ObjectId>,
    counts: &Counts,
) -> Vec<(String, String)> {
    let mut p: HashMap<&str, String> = HashMap::new();
    p.insert("merge.strategy", opts.strategy.to_string());
    p.insert("merge.of", revs.join(","));
    p.insert(
        "merge.weights",
        weights
            .iter()
            .map(f64::to_string)
            .collect::<Vec<_>>()
            .join(","),
    );
    if let Strategy::Ties { density } = opts.strategy {
        p.insert("merge.density", density.to_string());
    }
    if let Some(b) = base {
        p.insert("merge.base", b.to_hex());
    }
    // What became of the optimizer state: files left out, moments averaged (asked for, or in
    // the weights' own files), or none there.
    let optimizer = match (counts.left_out.is_empty(), counts.moments) {
        (false, _) => "left-out",
        (true, 0) if !opts.optimizer => "none",
        (true, _) => "averaged",
    };
    p.insert("merge.optimizer", optimizer.into());
    p.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}
