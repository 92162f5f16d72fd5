//! `mdl fsck`: decode and re-hash every object and check every reference.

use std::collections::HashSet;
use std::path::PathBuf;

use mdl_format::{ObjectId, ObjectKind};
use mdl_store::{IndexEntry, RefValue};
use serde::Serialize;

use crate::{Repository, Result};

/// What fsck found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// Objects decoded and verified.
    pub objects_checked: u64,
    /// Commits reachable from refs.
    pub commits_reachable: u64,
    /// Problems: anything here means the repository is damaged.
    pub problems: Vec<String>,
    /// Record files no index entry names (left by interrupted commits; harmless, `gc` removes).
    pub unindexed_records: u64,
    /// Temporary files left by interrupted writes (harmless).
    pub temp_files: Vec<PathBuf>,
    /// Tensors that reachable commits name and a retention rule deleted on purpose (expected,
    /// not problems).
    pub expired: u64,
    /// Longest delta chain (decode steps).
    pub longest_chain: u32,
    /// Leftover files `--repair` removed.
    pub repaired: Vec<PathBuf>,
}

impl Report {
    /// Whether the repository is sound.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks the whole repository; with `repair`, also removes leftovers of interrupted writes
/// (temporaries, unindexed record files, abandoned uploads) — never anything the index names.
pub fn fsck(repo: &Repository, repair: bool) -> Result<Report> {
    let store = repo.store();
    let mut report = Report::default();
    let meta = store.meta().read()?;
    let objects = meta.objects()?;
    let index: std::collections::HashMap<ObjectId, IndexEntry> = objects.iter().cloned().collect();
    let expired: std::collections::HashMap<ObjectId, mdl_store::Expired> =
        meta.expired_all()?.into_iter().collect();
    let cap = crate::policy::DeltaPolicy::from_store(store)?.max_depth;

    // 0. Expired objects are gone from the index.
    for id in expired.keys() {
        if index.contains_key(id) {
            report.problems.push(format!(
                "object {id} is indexed and also recorded as expired"
            ));
        }
    }

    // 1. Every indexed object decodes and hashes to its id; delta bases exist with consistent depth.
    for (id, entry) in &objects {
        report.objects_checked += 1;
        report.longest_chain = report.longest_chain.max(entry.depth);
        if entry.depth > cap {
            report.problems.push(format!(
                "object {id}: chain depth {} exceeds delta.max_depth {cap} (mdl compact fixes this)",
                entry.depth
            ));
        }
        if let Err(e) = store.read_object(id, entry, &mut std::io::sink()) {
            report.problems.push(e.to_string());
        }
        if let Some(base) = entry.base {
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
    }

    // 2. Refs → commits → manifests → tensors, and every parent.
    let mut expired_seen = HashSet::new();
    let mut want =
        |id: &ObjectId, kind: ObjectKind, from: &str, problems: &mut Vec<String>| -> bool {
            match index.get(id) {
                None if kind == ObjectKind::Tensor && expired.contains_key(id) => {
                    expired_seen.insert(*id);
                    false
                }
                None => {
                    problems.push(format!("{from}: {kind} {id} is missing"));
                    false
                }
                Some(e) if e.kind != kind => {
                    problems.push(format!("{from}: {id} is a {}, expected a {kind}", e.kind));
                    false
                }
                Some(_) => true,
            }
        };
    let mut stack: Vec<(ObjectId, String)> = Vec::new();
    for (name, value) in meta.refs("")? {
        match value {
            RefValue::Symbolic(target) => {
                if !target.starts_with("refs/heads/") {
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
    while let Some((id, from)) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        if !want(&id, ObjectKind::Commit, &from, &mut report.problems) {
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
        for p in &commit.parents {
            stack.push((*p, format!("parent of commit {}", id.short(12))));
        }
        let from = format!("commit {}", id.short(12));
        if !manifests_seen.insert(commit.manifest)
            || !want(
                &commit.manifest,
                ObjectKind::Manifest,
                &from,
                &mut report.problems,
            )
        {
            continue;
        }
        match repo.load_manifest(&commit.manifest) {
            Ok(m) => {
                for e in &m.entries {
                    let from =
                        format!("manifest {} tensor {:?}", commit.manifest.short(12), e.name);
                    if want(&e.id, ObjectKind::Tensor, &from, &mut report.problems)
                        && index[&e.id].content_len != e.header.data_len().unwrap_or(u64::MAX)
                    {
                        report.problems.push(format!(
                            "{from}: object size disagrees with dtype and shape"
                        ));
                    }
                }
            }
            Err(e) => report
                .problems
                .push(format!("manifest {}: {e}", commit.manifest)),
        }
    }

    report.expired = expired_seen.len() as u64;

    // 3. Leftovers of interrupted writes: reported, not problems.
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
            if std::fs::remove_file(&path).is_ok() {
                report.repaired.push(path);
            }
        }
    }
    Ok(report)
}
