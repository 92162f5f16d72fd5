//! `mdl gc`: delete what nothing can reach, and apply the retention rules.
//!
//! Roots are every ref, every reflog entry younger than `expire_reflog` (older entries are
//! deleted) and every commit younger than the grace period `prune_older_than` (a push may be
//! about to point a ref at it). What they reach — commits, parents, manifests, tensors — is
//! kept, and so is every other object younger than the grace period (a commit racing gc may
//! be about to name it). So a commit gc keeps is always whole.
//!
//! Retention (`retention.keep_last = N`) thins commits more than N first-parent steps behind a
//! branch tip: their optimizer-state tensors (the moments of the `quant.moments` pairings) are
//! deleted unless a commit kept in full names them too, and are recorded as *expired* — commit
//! and manifest ids never change. Tagged commits and branch tips are never thinned.
//!
//! A kept tensor may be stored as a delta against one that goes: it is re-encoded as a
//! self-contained record first. Deletion is one index transaction, taken under the repository's
//! writer after the roots are read again (a commit or ref change that happened during the scan
//! keeps what it names); record files are removed after it is durable, so a crash leaves at
//! worst unindexed files, which the next gc sweeps.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use mdl_format::{FileFormat, Manifest, ObjectId, ObjectKind, Timestamp};
use mdl_store::meta::{MetaRead, MetaWrite};
use mdl_store::{Expired, IndexEntry, Store};

pub use mdl_protocol::outcome::GcOutcome;

use crate::coarsen::{coarsen, COARSEN_AFTER};
use crate::history::CountSetting;
use crate::lossy::{LossyRequest, LossySettings, Pairing};
use crate::rewrite::reencode_group;
use crate::{Error, Progress, Repository, Result};

/// Configuration key of the retention rule.
pub const KEEP_LAST_KEY: &str = "retention.keep_last";

/// Files in `.mdl/incoming/` (uploads being received) are swept only when at least this old,
/// whatever the grace period: a server may be receiving one right now.
const INCOMING_MIN_AGE: Duration = Duration::from_secs(3600);

/// Options of a gc.
#[derive(Clone, Debug)]
pub struct GcOptions {
    /// Unreachable objects and leftover files younger than this are kept.
    pub prune_older_than: Duration,
    /// Reflog entries older than this are deleted (and stop protecting what they name).
    pub expire_reflog: Duration,
    /// Report, change nothing.
    pub dry_run: bool,
    /// With `dry_run`, also list the object folders for leftovers of interrupted writes (a
    /// directory scan of every record file: most of a dry run's time on a large repository).
    pub count_leftovers: bool,
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions {
            prune_older_than: Duration::from_secs(3600),
            expire_reflog: Duration::from_secs(30 * 86_400),
            dry_run: false,
            count_leftovers: true,
        }
    }
}

impl GcOptions {
    /// Options from their text forms (`0s`, `1h`, `30d`; see [`parse_duration`]), the defaults
    /// for those not given.
    pub fn parse(
        prune_older_than: Option<&str>,
        expire_reflog: Option<&str>,
        dry_run: bool,
    ) -> Result<GcOptions> {
        let d = GcOptions::default();
        Ok(GcOptions {
            prune_older_than: prune_older_than.map_or(Ok(d.prune_older_than), parse_duration)?,
            expire_reflog: expire_reflog.map_or(Ok(d.expire_reflog), parse_duration)?,
            dry_run,
            count_leftovers: true,
        })
    }
}

/// `retention.keep_last`: how many commits of each branch keep their moments.
pub(crate) const KEEP_LAST: CountSetting = CountSetting {
    key: KEEP_LAST_KEY,
    off: "all",
    expected: "all, or a whole number of commits (at least 1)",
};

/// Parses `0s`, `90m`, `1h`, `30d`, `2w` (a whole number and a unit).
pub fn parse_duration(s: &str) -> Result<Duration> {
    let bad = || Error::InvalidDuration(s.to_string());
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = t.split_at(split);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(bad()),
    };
    n.checked_mul(secs).map(Duration::from_secs).ok_or_else(bad)
}

/// The optimizer state among `manifest`'s tensors: what its moment pairs name as moments,
/// what the repository's moment pairings match by name, and in a torch archive the moments of
/// an optimizer's state dict (`state.K.exp_avg`, `state.K.exp_avg_sq`, wherever the dict
/// sits, as in a Lightning checkpoint's `optimizer_states.0.state.K.exp_avg`).
fn optimizer_state(manifest: &Manifest, pairings: &[Pairing]) -> HashSet<ObjectId> {
    let tensors: Vec<(usize, &mdl_format::Entry)> = manifest.tensors().collect();
    let mut out: HashSet<ObjectId> = manifest
        .pairs
        .iter()
        .flat_map(|p| [p.exp_avg, p.exp_avg_sq])
        .filter_map(|i| tensors.get(i as usize).map(|(_, e)| e.id))
        .collect();
    for (f, e) in tensors {
        let by_pattern = pairings.iter().any(|p| {
            Pairing::capture(&p.m, &e.name).is_some() || Pairing::capture(&p.v, &e.name).is_some()
        });
        let in_torch = manifest.files[f].format == FileFormat::Torch && {
            let parts: Vec<&str> = e.name.split('.').collect();
            parts.len() >= 3
                && matches!(parts[parts.len() - 1], "exp_avg" | "exp_avg_sq")
                && parts[parts.len() - 2].parse::<u64>().is_ok()
                && parts[parts.len() - 3] == "state"
        };
        if by_pattern || in_torch {
            out.insert(e.id);
        }
    }
    out
}

/// What the roots reach, and what retention lets go.
#[derive(Default)]
struct Marks {
    commits: HashSet<ObjectId>,
    manifests: HashSet<ObjectId>,
    /// Tensors kept.
    tensors: HashSet<ObjectId>,
    /// Optimizer tensors of thinned commits that no kept commit names.
    expire: HashSet<ObjectId>,
    /// Commits retention thins.
    thinned: HashSet<ObjectId>,
    /// The optimizer tensors each thinned commit names.
    thin_moments: HashMap<ObjectId, Vec<ObjectId>>,
    /// Manifests whose optimizer tensors went to `expire` (a full commit naming the same
    /// manifest takes them back).
    diverted: HashSet<ObjectId>,
}

/// Commits written at or after `young`. They are roots too: a young commit may be about to
/// become a ref's target (a push uploads a commit, then moves the ref), so what it names is
/// kept with it — an indexed commit is always whole, never one whose manifest or tensors gc
/// took.
fn young_commits(meta: &MetaRead, young: Timestamp) -> Result<Vec<ObjectId>> {
    let mut out = Vec::new();
    for (id, _) in meta.commits()? {
        if meta.object(&id)?.is_some_and(|e| e.created >= young) {
            out.push(id);
        }
    }
    Ok(out)
}

/// The roots: ref targets and the ids of reflog entries not older than `since`.
fn roots(meta: &MetaRead, since: Timestamp) -> Result<Vec<ObjectId>> {
    let mut out = Vec::new();
    for (_, v) in meta.refs("")? {
        out.extend(v.target());
    }
    for name in meta.reflog_names()? {
        for e in meta.reflog(&name)? {
            if e.time >= since {
                out.extend(e.old);
                out.extend(e.new);
            }
        }
    }
    Ok(out)
}

/// Marks from `starts`, skipping commits already marked (so a second call only walks what is
/// new); tensors of thinned commits that are optimizer state go to `expire` for now.
fn mark(
    repo: &Repository,
    meta: &MetaRead,
    starts: &[ObjectId],
    pairings: &[Pairing],
    marks: &mut Marks,
) -> Result<()> {
    let mut stack: Vec<ObjectId> = starts.to_vec();
    while let Some(id) = stack.pop() {
        if marks.commits.contains(&id) {
            continue;
        }
        let Some(summary) = meta.commit(&id)? else {
            // Not a commit this repository has (fsck reports such refs); nothing to keep.
            continue;
        };
        marks.commits.insert(id);
        stack.extend(summary.parents.iter().copied());
        let thin = marks.thinned.contains(&id);
        if !marks.manifests.insert(summary.manifest) {
            // The same manifest may belong to a thinned and a full commit.
            if !thin && marks.diverted.contains(&summary.manifest) {
                keep_in_full(repo, &summary.manifest, marks)?;
            }
            continue;
        }
        if meta.object(&summary.manifest)?.is_none() {
            continue;
        }
        let manifest = repo.load_manifest(&summary.manifest)?;
        let moments = if thin {
            optimizer_state(&manifest, pairings)
        } else {
            HashSet::new()
        };
        for (object, _) in manifest.objects() {
            if moments.contains(&object) {
                marks.expire.insert(object);
                marks.thin_moments.entry(id).or_default().push(object);
                marks.diverted.insert(summary.manifest);
            } else {
                marks.tensors.insert(object);
            }
        }
    }
    Ok(())
}

impl Marks {
    /// How many objects are marked to be kept.
    fn live(&self) -> u64 {
        (self.commits.len() + self.manifests.len() + self.tensors.len()) as u64
    }
}

/// Keeps every tensor of `manifest`, optimizer state included.
fn keep_in_full(repo: &Repository, manifest: &ObjectId, marks: &mut Marks) -> Result<()> {
    let m = repo.load_manifest(manifest)?;
    marks.tensors.extend(m.objects().map(|(id, _)| id));
    Ok(())
}

/// Runs gc on the repository.
#[tracing::instrument(name = "gc", skip_all)]
pub fn gc(repo: &Repository, opts: &GcOptions, progress: &dyn Progress) -> Result<GcOutcome> {
    let run = Run::new(repo, opts)?;
    let mut out = GcOutcome {
        dry_run: opts.dry_run,
        ..Default::default()
    };
    // Coarsen what retention.coarsen_after says (its own transaction; ids do not change).
    if let Some(n) = COARSEN_AFTER.configured(repo)? {
        out.coarsened = coarsen(repo, n, run.keep, opts.dry_run, progress)?;
        if !opts.dry_run {
            let c = &out.coarsened;
            out.bytes_freed += c.bytes_before.saturating_sub(c.bytes_after);
        }
    }
    // Mark, without holding the writer.
    let (mut marks, kept_by_young_commits) = run.mark_all()?;
    let mut plan = plan(repo, &marks, run.prune_cutoff)?;
    plan.young += kept_by_young_commits;
    if opts.dry_run {
        run.report_dry(&marks, &plan, &mut out)?;
        return Ok(out);
    }
    // Kept tensors whose bases go become self-contained, a chain at a time.
    progress.start_count("re-encoding", plan.rebase.len() as u64);
    for id in &plan.rebase {
        let (done, _, _) = reencode_group(repo, std::slice::from_ref(id))?;
        out.reencoded += done;
        progress.advance(1);
    }
    progress.finish();
    // Delete, under the writer.
    let writer = repo.writer();
    let store = repo.store();
    let mut w = store.meta().write()?;
    run.mark_since(&mut marks, &mut plan)?;
    keep_what_decodes_through(&w, &mut plan)?;
    let removed = run.remove_from_index(&mut w, &plan)?;
    for name in w.reflog_names()? {
        out.reflog_expired += w.expire_reflog(&name, run.reflog_cutoff)? as u64;
    }
    w.commit_txn()?;
    count(&mut out, removed.iter().map(|(_, e, x)| (e, *x)));
    out.kept_young = plan.young;
    out.thinned_commits = newly_thinned(&marks, &plan);
    run.remove_files(&removed, &mut out)?;
    drop(writer);
    tracing::info!(
        commits = out.commits,
        bytes_freed = out.bytes_freed,
        "collected"
    );
    Ok(out)
}

/// What one gc run goes by: its time, the cutoffs its options give, and retention.
struct Run<'a> {
    repo: &'a Repository,
    opts: &'a GcOptions,
    now: Timestamp,
    /// Reflog entries older than this are dropped, and are no longer roots.
    reflog_cutoff: Timestamp,
    /// Unreachable objects (and leftover files) younger than this are kept.
    prune_cutoff: Timestamp,
    /// `retention.keep_last`: commits further behind a tip lose their optimizer state.
    keep: Option<u64>,
    pairings: Vec<Pairing>,
}

/// An object gc removed from the index: its id, its entry, whether retention expired it.
type Removed = (ObjectId, IndexEntry, bool);

impl<'a> Run<'a> {
    fn new(repo: &'a Repository, opts: &'a GcOptions) -> Result<Run<'a>> {
        let now = Timestamp::now();
        let before = |d: Duration| Timestamp(now.0 - d.as_millis().min(i64::MAX as u128) as i64);
        Ok(Run {
            repo,
            opts,
            now,
            reflog_cutoff: before(opts.expire_reflog),
            prune_cutoff: before(opts.prune_older_than),
            keep: KEEP_LAST.configured(repo)?,
            pairings: LossySettings::resolve(repo.store(), &LossyRequest::default())?.pairings,
        })
    }

    /// Marks from the roots, then from young commits; returns the marks and how many objects
    /// only young commits keep.
    fn mark_all(&self) -> Result<(Marks, u64)> {
        let meta = self.repo.store().meta().read()?;
        let mut marks = Marks {
            thinned: match self.keep {
                Some(n) => crate::history::behind_tips(&meta, n)?,
                None => HashSet::new(),
            },
            ..Marks::default()
        };
        let roots = roots(&meta, self.reflog_cutoff)?;
        mark(self.repo, &meta, &roots, &self.pairings, &mut marks)?;
        let reached = marks.live();
        let young = young_commits(&meta, self.prune_cutoff)?;
        mark(self.repo, &meta, &young, &self.pairings, &mut marks)?;
        let by_young = marks.live() - reached;
        Ok((marks, by_young))
    }

    /// What a dry run reports: what the plan would delete, expire and re-encode, the reflog
    /// entries that would go and (if asked) the leftover files.
    fn report_dry(&self, marks: &Marks, plan: &Plan, out: &mut GcOutcome) -> Result<()> {
        let store = self.repo.store();
        let meta = store.meta().read()?;
        let mut doomed = Vec::new();
        for (ids, expired) in [(&plan.delete, false), (&plan.expire, true)] {
            for id in ids {
                doomed.extend(meta.object(id)?.map(|e| (e, expired)));
            }
        }
        count(out, doomed.iter().map(|(e, x)| (e, *x)));
        out.kept_young = plan.young;
        out.reencoded = plan.rebase.len() as u64;
        out.thinned_commits = newly_thinned(marks, plan);
        for name in meta.reflog_names()? {
            out.reflog_expired += meta
                .reflog(&name)?
                .iter()
                .filter(|e| e.time < self.reflog_cutoff)
                .count() as u64;
        }
        if self.opts.count_leftovers {
            for (_, len) in old_leftovers(store, self.prune_cutoff)? {
                out.leftover_files += 1;
                out.bytes_freed += len;
            }
        }
        Ok(())
    }

    /// Under the writer: marks what changed since the first scan — commits made meanwhile
    /// (only they are walked, everything else is marked already) and commits that became a
    /// ref's target (never thinned) — and takes what they keep out of the plan.
    fn mark_since(&self, marks: &mut Marks, plan: &mut Plan) -> Result<()> {
        let meta = self.repo.store().meta().read()?;
        let mut starts = roots(&meta, self.reflog_cutoff)?;
        starts.extend(young_commits(&meta, self.prune_cutoff)?);
        mark(self.repo, &meta, &starts, &self.pairings, marks)?;
        for (_, v) in meta.refs("")? {
            if let Some(t) = v.target().filter(|t| marks.thinned.remove(t)) {
                if let Some(s) = meta.commit(&t)? {
                    keep_in_full(self.repo, &s.manifest, marks)?;
                }
            }
        }
        plan.delete.retain(|id| {
            !marks.commits.contains(id)
                && !marks.manifests.contains(id)
                && !marks.tensors.contains(id)
        });
        plan.expire.retain(|id| !marks.tensors.contains(id));
        Ok(())
    }

    /// Removes the plan's objects from the index, in the caller's transaction; expired ones
    /// leave an expiry record naming the rule.
    fn remove_from_index(&self, w: &mut MetaWrite<'_>, plan: &Plan) -> Result<Vec<Removed>> {
        let rule = self.keep.map(|n| format!("{KEEP_LAST_KEY}={n}"));
        let mut removed = Vec::new();
        for id in &plan.delete {
            if let Some(e) = w.remove_object(id)? {
                if e.kind == ObjectKind::Commit {
                    w.remove_commit(id)?;
                }
                removed.push((*id, e, false));
            }
        }
        for id in &plan.expire {
            if let Some(e) = w.remove_object(id)? {
                let expired = Expired {
                    kind: e.kind,
                    content_len: e.content_len,
                    time: self.now,
                    rule: rule.clone().unwrap_or_default(),
                };
                w.put_expired(id, &expired)?;
                removed.push((*id, e, true));
            }
        }
        Ok(removed)
    }

    /// Files, once the index no longer names them: the records of what was removed and their
    /// decoded tips, then leftovers of interrupted writes (the caller holds the writer, so no
    /// commit of this process is between writing and indexing them); then the journal shrinks
    /// to one entry of the current state.
    fn remove_files(&self, removed: &[Removed], out: &mut GcOutcome) -> Result<()> {
        let store = self.repo.store();
        for (id, e, _) in removed {
            store.remove_record(id, e.generation);
        }
        for (path, len) in old_leftovers(store, self.prune_cutoff)? {
            if store.remove_leftover(&path) {
                out.leftover_files += 1;
                out.bytes_freed += len;
            }
        }
        out.bytes_freed += crate::repack::unpack_sparse(self.repo)?.bytes_freed;
        // Decoded tips of objects the index no longer names (removed now, or a commit that
        // failed after keeping them).
        let meta = store.meta().read()?;
        out.bytes_freed += store.prune_tips(|id| matches!(meta.object(id), Ok(Some(_))));
        drop(meta);
        store.meta().compact_journal()?;
        Ok(())
    }
}

/// Whatever still decodes through a doomed object keeps it (a concurrent commit made it a
/// base, or re-encoding it was skipped).
fn keep_what_decodes_through(w: &MetaWrite<'_>, plan: &mut Plan) -> Result<()> {
    loop {
        let doomed: HashSet<ObjectId> = plan.delete.union(&plan.expire).copied().collect();
        let mut saved = Vec::new();
        for id in &doomed {
            if w.dependents(id)?.iter().any(|d| !doomed.contains(d)) {
                saved.push(*id);
            }
        }
        if saved.is_empty() {
            return Ok(());
        }
        for id in saved {
            plan.delete.remove(&id);
            plan.expire.remove(&id);
        }
    }
}

/// What gc will delete.
struct Plan {
    /// Unreachable objects past the grace period.
    delete: HashSet<ObjectId>,
    /// Tensors retention lets go.
    expire: HashSet<ObjectId>,
    /// Kept tensors that decode through something deleted: re-encoded first.
    rebase: Vec<ObjectId>,
    /// Unreachable objects kept for the grace period.
    young: u64,
}

fn plan(repo: &Repository, marks: &Marks, prune_cutoff: Timestamp) -> Result<Plan> {
    let meta = repo.store().meta().read()?;
    let index: HashMap<ObjectId, IndexEntry> = meta.objects()?.into_iter().collect();
    let mut delete = HashSet::new();
    let mut expire = HashSet::new();
    let mut young = 0;
    for (id, e) in &index {
        let live = match e.kind {
            ObjectKind::Commit => marks.commits.contains(id),
            ObjectKind::Manifest => marks.manifests.contains(id),
            ObjectKind::Tensor => marks.tensors.contains(id),
        };
        if live {
            continue;
        }
        if marks.expire.contains(id) {
            expire.insert(*id);
        } else if e.created < prune_cutoff {
            delete.insert(*id);
        } else {
            young += 1;
        }
    }
    let rebase = index
        .iter()
        .filter(|(id, e)| {
            !delete.contains(*id)
                && !expire.contains(*id)
                && e.base
                    .is_some_and(|b| delete.contains(&b) || expire.contains(&b))
        })
        .map(|(id, _)| *id)
        .collect();
    Ok(Plan {
        delete,
        expire,
        rebase,
        young,
    })
}

/// Counts deleted objects (`true`: expired by retention) and the bytes their records held.
fn count<'e>(out: &mut GcOutcome, removed: impl Iterator<Item = (&'e IndexEntry, bool)>) {
    for (e, expired) in removed {
        match (expired, e.kind) {
            (true, _) => out.expired += 1,
            (false, ObjectKind::Commit) => out.commits += 1,
            (false, ObjectKind::Manifest) => out.manifests += 1,
            (false, ObjectKind::Tensor) => out.tensors += 1,
        }
        // A packed record's bytes go with its pack (counted when the pack is removed).
        if e.pack.is_none() {
            out.bytes_freed += e.stored_len;
        }
    }
}

/// Commits that lose a tensor to retention in this run.
fn newly_thinned(marks: &Marks, plan: &Plan) -> u64 {
    marks
        .thin_moments
        .values()
        .filter(|ids| ids.iter().any(|id| plan.expire.contains(id)))
        .count() as u64
}

/// Files in `.mdl` that nothing names: record files the index does not point to
/// (interrupted writes, replaced generations), packs it names no record of, temporaries of interrupted writes, uploads in
/// `incoming/` (being received, or abandoned) and the starts of records a fetch was cut off
/// inside (`partial/`, kept for the next fetch).
pub(crate) struct Leftovers {
    /// Unindexed record files and packs.
    pub(crate) records: Vec<PathBuf>,
    /// `.tmp-*` files in the object directories and `packs/`.
    pub(crate) temps: Vec<PathBuf>,
    /// Files in `incoming/` and `partial/`.
    pub(crate) incoming: Vec<PathBuf>,
}

/// Lists the leftovers of `store`.
pub(crate) fn leftovers(store: &Store) -> Result<Leftovers> {
    let meta = store.meta().read()?;
    let mut records = Vec::new();
    for (id, generation) in store.record_files()? {
        if meta
            .object(&id)?
            .is_none_or(|e| e.generation != generation || e.pack.is_some())
        {
            records.push(store.record_path(&id, generation));
        }
    }
    records.extend(crate::repack::unnamed(store, &meta)?);
    let incoming = [mdl_store::INCOMING_DIR, crate::transfer::PARTIAL_DIR]
        .into_iter()
        .flat_map(|dir| std::fs::read_dir(store.dir().join(dir)))
        .flatten()
        .flatten()
        .map(|f| f.path())
        .collect();
    Ok(Leftovers {
        records,
        temps: store.temp_files()?,
        incoming,
    })
}

/// Leftovers last modified before `cutoff` (uploads: also at least [`INCOMING_MIN_AGE`] ago),
/// with their sizes.
fn old_leftovers(store: &Store, cutoff: Timestamp) -> Result<Vec<(PathBuf, u64)>> {
    let cutoff = SystemTime::UNIX_EPOCH + Duration::from_millis(cutoff.0.max(0) as u64);
    let old_enough = |path: &Path, limit: SystemTime| -> Option<u64> {
        let md = std::fs::symlink_metadata(path).ok()?;
        (md.is_file() && md.modified().ok()? <= limit).then_some(md.len())
    };
    // An unpacked tree upload (`incoming/` holds no other folders): as old as its newest file.
    let old_folder = |path: &Path, limit: SystemTime| -> Option<u64> {
        let md = std::fs::symlink_metadata(path).ok()?;
        if !md.is_dir() {
            return None;
        }
        let (mut len, mut newest) = (0, md.modified().ok()?);
        let mut dirs = vec![path.to_path_buf()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).ok()?.flatten() {
                let md = e.metadata().ok()?;
                newest = newest.max(md.modified().ok()?);
                if md.is_dir() {
                    dirs.push(e.path());
                } else {
                    len += md.len();
                }
            }
        }
        (newest <= limit).then_some(len)
    };
    let found = leftovers(store)?;
    let upload_limit = cutoff.min(SystemTime::now() - INCOMING_MIN_AGE);
    let files = found.records.into_iter().chain(found.temps);
    Ok(files
        .map(|p| (p, cutoff))
        .chain(found.incoming.into_iter().map(|p| (p, upload_limit)))
        .filter_map(|(p, limit)| {
            old_enough(&p, limit)
                .or_else(|| old_folder(&p, limit))
                .map(|len| (p, len))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("90m").unwrap(), Duration::from_secs(5400));
        assert_eq!(
            parse_duration("30d").unwrap(),
            Duration::from_secs(2_592_000)
        );
        assert_eq!(
            parse_duration("2w").unwrap(),
            Duration::from_secs(1_209_600)
        );
        for bad in ["", "h", "1", "1y", "-1h", "1.5h", "99999999999999999999w"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(KEEP_LAST.parse("all").unwrap(), None);
        assert_eq!(KEEP_LAST.parse("3").unwrap(), Some(3));
        assert!(KEEP_LAST.parse("0").is_err());
    }
}
