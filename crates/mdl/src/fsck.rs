//! `mdl fsck`: decode and re-hash every object and check every reference.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use mdl_format::{ObjectId, ObjectKind, Ref, Region};
use mdl_store::meta::MetaRead;
use mdl_store::{IndexEntry, OpenOptions, RefValue, StoreError, MDL_DIR};

pub use mdl_protocol::outcome::FsckReport;

use crate::{Error, Repository, Result};

pub use mdl_store::rebuild::Rebuilt;

/// Checks `meta.redb` itself: redb's integrity check on a copy of the file, and that the
/// journal (what a rebuild would restore refs, reflogs, configuration and expiry from) agrees
/// with it. With `repair`, a disagreeing journal is rewritten from the sound database.
///
/// The integrity check runs only where this process has the database open for reading: a
/// database open for writing is not in its closed state on disk (redb records its allocator
/// state when it closes), so a copy of it would not check clean. [`repair`] checks before it
/// opens for writing.
fn check_database(repo: &Repository, repair: bool, report: &mut FsckReport) -> Result<()> {
    let dir = repo.store().dir();
    let damage = if repo.store().writable() {
        None
    } else {
        mdl_store::rebuild::check_file(&dir.join(mdl_store::meta::META_FILE))?
    };
    if let Some(why) = damage {
        report.database_damaged = true;
        report.problems.push(format!(
            "meta.redb is damaged ({why}); `mdl fsck --repair` rebuilds it"
        ));
        return Ok(());
    }
    let journal = dir.join(mdl_store::journal::JOURNAL_FILE);
    let state = repo.store().meta().read()?.journaled()?;
    let replayed = if journal.exists() {
        Some(mdl_store::journal::replay(&journal)?)
    } else {
        None
    };
    // What a writer killed between appending to the journal and committing leaves (an entry
    // cut short, or one entry the database never got) is harmless: the next writer clears it.
    let agrees = replayed
        .as_ref()
        .is_some_and(|r| r.skipped.is_empty() && (r.state == state || r.before_last == state));
    if agrees {
        return Ok(());
    }
    if repair && repo.store().writable() {
        repo.store().meta().compact_journal()?;
        report.repaired.push(journal);
    } else {
        report.journal_differs = true;
        report.problems.push(match replayed {
            None => "the journal is missing (`mdl fsck --repair` writes it from meta.redb)".into(),
            Some(r) if !r.skipped.is_empty() => format!(
                "the journal has {} unreadable part(s) (`mdl fsck --repair` rewrites it from meta.redb)",
                r.skipped.len()
            ),
            Some(_) => "the journal disagrees with meta.redb on refs, reflogs, configuration or expiry (`mdl fsck --repair` rewrites it from meta.redb)".into(),
        });
    }
    Ok(())
}

/// `mdl fsck --repair` on the repository at or above `dir`: when `meta.redb` is missing or
/// damaged it is rebuilt from the object records and the journal first; then the repository is
/// checked and leftovers removed ([`fsck`] with `repair`). Returns what the rebuild did, if one
/// ran, and the report.
pub fn repair(dir: &Path, opts: &OpenOptions) -> Result<(Option<Rebuilt>, FsckReport)> {
    let rebuild = |root: &Path| -> Result<Rebuilt> {
        Ok(mdl_store::rebuild::rebuild(&root.join(MDL_DIR), opts.wait)?)
    };
    let root =
        crate::repo::discover(dir).ok_or_else(|| StoreError::NotARepository(dir.to_path_buf()))?;
    // First the database as it is on disk, opened for reading (see check_database).
    let read = OpenOptions {
        mode: mdl_store::LockMode::Check,
        ..opts.clone()
    };
    let damaged = match Repository::open(&root, &read) {
        Err(Error::Store(StoreError::Damaged(_))) => true,
        Err(e) => return Err(e),
        Ok(repo) => {
            let mut report = FsckReport::default();
            check_database(&repo, false, &mut report)?;
            report.database_damaged
        }
    };
    let rebuilt = if damaged { Some(rebuild(&root)?) } else { None };
    let repo = Repository::open(&root, opts)?;
    Ok((rebuilt, fsck(&repo, true)?))
}

/// Checks the whole repository; with `repair`, also removes leftovers of interrupted writes
/// (temporaries, unindexed record files, abandoned uploads) — never anything the index names.
pub fn fsck(repo: &Repository, repair: bool) -> Result<FsckReport> {
    fsck_with(repo, repair, &crate::NoProgress)
}

/// [`fsck`], reporting the records read (bytes) to `progress`.
pub fn fsck_with(
    repo: &Repository,
    repair: bool,
    progress: &dyn crate::Progress,
) -> Result<FsckReport> {
    let store = repo.store();
    let mut report = FsckReport::default();
    check_database(repo, repair, &mut report)?;
    if report.database_damaged {
        return Ok(report);
    }
    let meta = store.meta().read()?;
    let objects = meta.objects()?;
    let mut known = Known {
        index: objects.iter().cloned().collect(),
        expired: meta.expired_all()?.into_iter().collect(),
        expired_seen: HashSet::new(),
    };
    check_expired(&known, &mut report);
    check_objects(repo, &meta, &objects, &known.index, progress, &mut report)?;
    check_history(repo, &meta, &mut known, &mut report)?;
    report.expired = known.expired_seen.len() as u64;
    check_leftovers(repo, repair, &mut report)?;
    Ok(report)
}

/// The index and the expiry records, and the expired tensors the history still names.
struct Known {
    index: HashMap<ObjectId, IndexEntry>,
    expired: HashMap<ObjectId, mdl_store::Expired>,
    expired_seen: HashSet<ObjectId>,
}

impl Known {
    /// Whether `id`, named by `from`, is indexed as a `kind`; a problem if not, unless it is a
    /// tensor that expired.
    fn want(
        &mut self,
        id: &ObjectId,
        kind: ObjectKind,
        from: &str,
        report: &mut FsckReport,
    ) -> bool {
        match self.index.get(id) {
            None if kind == ObjectKind::Tensor && self.expired.contains_key(id) => {
                self.expired_seen.insert(*id);
                false
            }
            None => {
                report
                    .problems
                    .push(format!("{from}: {kind} {id} is missing"));
                false
            }
            Some(e) if e.kind != kind => {
                report
                    .problems
                    .push(format!("{from}: {id} is a {}, expected a {kind}", e.kind));
                false
            }
            Some(_) => true,
        }
    }
}

/// Expired objects are gone from the index.
fn check_expired(known: &Known, report: &mut FsckReport) {
    for id in known.expired.keys() {
        if known.index.contains_key(id) {
            report.problems.push(format!(
                "object {id} is indexed and also recorded as expired"
            ));
        }
    }
}

/// Every indexed object decodes and hashes to its id; its delta base exists, with a
/// consistent depth within the policy's cap, and lists it as a dependent.
fn check_objects(
    repo: &Repository,
    meta: &MetaRead,
    objects: &[(ObjectId, IndexEntry)],
    index: &HashMap<ObjectId, IndexEntry>,
    progress: &dyn crate::Progress,
    report: &mut FsckReport,
) -> Result<()> {
    let store = repo.store();
    let cap = crate::policy::DeltaPolicy::from_store(store)?.max_depth;
    progress.start("checking", objects.iter().map(|(_, e)| e.stored_len).sum());
    for (id, entry) in objects {
        progress.advance(entry.stored_len);
        report.objects_checked += 1;
        report.longest_chain = report.longest_chain.max(entry.depth);
        if entry.depth > cap {
            report.problems.push(format!(
                "object {id}: chain depth {} exceeds delta.max_depth {cap} (mdl compact fixes this)",
                entry.depth
            ));
        }
        match store.read_object(id, entry, &mut std::io::sink()) {
            // This machine cannot take the record (a replica's cache on a full disk): the
            // check stops, saying why, and calls nothing damaged.
            Err(e) if e.is_local_write_failure() => return Err(e.into()),
            Err(e) => report.problems.push(e.to_string()),
            Ok(_) => {}
        }
        let Some(base) = entry.base else {
            continue;
        };
        match index.get(&base) {
            None => report
                .problems
                .push(format!("object {id}: delta base {base} is missing")),
            Some(b) if b.depth + 1 != entry.depth => report.problems.push(format!(
                "object {id}: chain depth {} but its base has depth {}",
                entry.depth, b.depth
            )),
            Some(_) => {}
        }
        if !meta.dependents(&base)?.contains(id) {
            report.problems.push(format!(
                "object {id}: not listed as a dependent of its base {base}"
            ));
        }
    }
    progress.finish();
    Ok(())
}

/// Refs → commits → manifests → tensors, and every parent: each is indexed as what it is
/// named as, and each commit agrees with the commit index.
fn check_history(
    repo: &Repository,
    meta: &MetaRead,
    known: &mut Known,
    report: &mut FsckReport,
) -> Result<()> {
    let mut stack: Vec<(ObjectId, String)> = Vec::new();
    for (name, value) in meta.refs("")? {
        match value {
            RefValue::Symbolic(target) => {
                if !matches!(Ref::parse(&target), Some(Ref::Branch(_))) {
                    report
                        .problems
                        .push(format!("{name} points at {target}, not a branch"));
                }
            }
            v => stack.push((v.target().expect("direct"), name)),
        }
    }
    let mut seen = HashSet::new();
    let mut manifests_seen = HashSet::new();
    let cut: HashSet<ObjectId> = meta.shallow()?.into_iter().collect();
    while let Some((id, from)) = stack.pop() {
        if !seen.insert(id) || !known.want(&id, ObjectKind::Commit, &from, report) {
            continue;
        }
        report.commits_reachable += 1;
        let commit = match repo.load_commit(&id) {
            Ok(c) => c,
            Err(e) => {
                report.problems.push(format!("commit {id}: {e}"));
                continue;
            }
        };
        match meta.commit(&id)? {
            None => report
                .problems
                .push(format!("commit {id} is not in the commit index")),
            Some(s) if s.parents != commit.parents || s.manifest != commit.manifest => {
                report.problems.push(format!(
                    "commit {id}: commit index disagrees with the object"
                ))
            }
            Some(_) => {}
        }
        if cut.contains(&id) {
            // A shallow clone's end of history: its parents are not here on purpose.
            report.cut += 1;
        } else {
            for p in &commit.parents {
                stack.push((*p, format!("parent of commit {}", id.short(12))));
            }
        }
        let from = format!("commit {}", id.short(12));
        if manifests_seen.insert(commit.manifest)
            && known.want(&commit.manifest, ObjectKind::Manifest, &from, report)
        {
            check_manifest(repo, &commit.manifest, known, report);
        }
    }
    Ok(())
}

/// Every object manifest `id` names is an indexed tensor (or an expired one) of the size its
/// dtype and shape give.
fn check_manifest(repo: &Repository, id: &ObjectId, known: &mut Known, report: &mut FsckReport) {
    let manifest = match repo.load_manifest(id) {
        Ok(m) => m,
        Err(e) => return report.problems.push(format!("manifest {id}: {e}")),
    };
    for f in &manifest.files {
        for r in &f.regions {
            let Some((object, header)) = r.object() else {
                continue;
            };
            let from = match r {
                Region::Tensor(e) => format!(
                    "manifest {} file {:?} tensor {:?}",
                    id.short(12),
                    f.path,
                    e.name
                ),
                _ => format!("manifest {} file {:?} bytes", id.short(12), f.path),
            };
            if known.want(&object, ObjectKind::Tensor, &from, report)
                && known.index[&object].content_len != header.data_len().unwrap_or(u64::MAX)
            {
                report.problems.push(format!(
                    "{from}: object size disagrees with dtype and shape"
                ));
            }
        }
    }
}

/// Leftovers of interrupted writes: reported, not problems; with `repair`, removed.
fn check_leftovers(repo: &Repository, repair: bool, report: &mut FsckReport) -> Result<()> {
    let store = repo.store();
    let found = crate::gc::leftovers(store)?;
    report.unindexed_records = found.records.len() as u64;
    report.temp_files = found.temps.clone();
    if repair {
        for path in found
            .records
            .into_iter()
            .chain(found.temps)
            .chain(found.incoming)
        {
            if store.remove_leftover(&path) {
                report.repaired.push(path);
            }
        }
    }
    Ok(())
}
