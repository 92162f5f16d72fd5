//! Large tensors (64 MiB and more) are written framed, encoded in the pass that hashes them:
//! deferred and eager reverse deltas end with the same records, a tensor the store already
//! has (under another name) leaves nothing behind, an unchanged one is not encoded again, and
//! every version checks out byte for byte.

// Tests write their own files (checkpoints, outputs).
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mdl::checkout::{checkout, CheckoutOptions};
use mdl::commit::{commit, CommitOptions};
use mdl::policy::{DeltaMode, DeltaPolicy};
use mdl::{NoProgress, ObjectId, Repository};

mod common;
use common::{write_safetensors, Rng};

/// f32 elements of the large tensor: 68 MiB, eight frames and a half.
const N: usize = 17 << 20;

fn le(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Three checkpoints: `w` drifting; the second also holds `w` of the first under another
/// name; the third is the second again.
fn checkpoints(dir: &Path) -> Vec<PathBuf> {
    let mut rng = Rng(11);
    let first: Vec<f32> = (0..N).map(|_| (rng.normal() * 0.02) as f32).collect();
    let second: Vec<f32> = first
        .iter()
        .map(|x| x + (rng.normal() * 1e-5) as f32)
        .collect();
    let shape = vec![N as u64];
    let files = [
        vec![("w", "F32", shape.clone(), le(&first))],
        vec![
            ("w", "F32", shape.clone(), le(&second)),
            ("w_start", "F32", shape.clone(), le(&first)),
        ],
        vec![
            ("w", "F32", shape.clone(), le(&second)),
            ("w_start", "F32", shape, le(&first)),
        ],
    ];
    files
        .iter()
        .enumerate()
        .map(|(k, tensors)| {
            let path = dir.join(format!("ckpt{k}.safetensors"));
            write_safetensors(&path, tensors);
            path
        })
        .collect()
}

/// Every tensor record of the repository's history, by id: its index entry (all but the time
/// it was written) and its bytes.
fn records(repo: &Repository, commits: &[ObjectId]) -> BTreeMap<String, (String, Vec<u8>)> {
    let mut out = BTreeMap::new();
    for c in commits {
        for t in mdl::show::show(repo, &c.to_hex()).unwrap().tensors {
            let e = mdl::inspect::object(repo, &t.id).unwrap().unwrap();
            let entry = (e.codec, e.generation, e.base, e.depth, e.stored_len);
            let record = mdl::inspect::record(repo, &t.id).unwrap();
            out.insert(t.id.to_hex(), (format!("{entry:?}"), record));
        }
    }
    out
}

/// Commits the checkpoints under `defer`; works the deferred queue at the end.
fn run(dir: &Path, files: &[PathBuf], defer: bool) -> (Repository, Vec<ObjectId>) {
    let repo = Repository::init(dir).unwrap();
    let opts = CommitOptions {
        delta: Some(DeltaPolicy {
            mode: DeltaMode::Reverse,
            max_depth: 8,
            max_restore_cost: None,
            defer,
        }),
        ..CommitOptions::default()
    };
    let ids = files
        .iter()
        .map(|f| commit(&repo, f, &opts, &NoProgress).unwrap().id)
        .collect();
    mdl::commit::run_deferred(&repo, None, &|| false).unwrap();
    (repo, ids)
}

#[test]
fn large_tensors_are_framed_and_end_where_eager_commits_do() {
    let dir = tempfile::tempdir().unwrap();
    let files = checkpoints(dir.path());
    let (deferred, ids) = run(&dir.path().join("deferred"), &files, true);
    let (eager, eager_ids) = run(&dir.path().join("eager"), &files, false);
    let (a, b) = (records(&deferred, &ids), records(&eager, &eager_ids));
    assert_eq!(a.len(), 2, "two distinct tensors");
    assert_eq!(a, b, "deferred and eager commits store the same records");

    // The newest `w` is whole, the first a delta against it; both framed.
    let show = |rev| mdl::show::show(&deferred, rev).unwrap();
    let w = |s: &mdl::show::Shown| s.tensors.iter().find(|t| t.name == "w").unwrap().clone();
    let (new, old) = (w(&show("main")), w(&show("main~2")));
    assert_eq!(new.codec, "float-split");
    assert_eq!(old.base, Some(new.id), "{}", old.codec);
    for id in [new.id, old.id] {
        let record = mdl::inspect::record(&deferred, &id).unwrap();
        let (_, payload, _) = mdl_format::record::decode(&record).unwrap();
        assert!(mdl_codec::float::is_framed(payload));
    }

    // `w_start` was the first commit's `w`: encoded again under its new name, then dropped.
    let objects = dir.path().join("deferred/.mdl/objects");
    let mut left = Vec::new();
    for d in std::fs::read_dir(&objects).unwrap() {
        for f in std::fs::read_dir(d.unwrap().path()).unwrap() {
            let name = f.unwrap().file_name().to_string_lossy().to_string();
            if name.starts_with(".tmp-") {
                left.push(name);
            }
        }
    }
    assert!(left.is_empty(), "{left:?}");

    for (k, (file, id)) in files.iter().zip(&ids).enumerate() {
        let out = dir.path().join(format!("out{k}"));
        checkout(
            &deferred,
            &id.to_hex(),
            &out,
            &CheckoutOptions::default(),
            &NoProgress,
        )
        .unwrap();
        assert!(
            std::fs::read(&out).unwrap() == std::fs::read(file).unwrap(),
            "commit {k} checks out byte for byte"
        );
    }
    let report = mdl::fsck::fsck(&deferred, false).unwrap();
    assert!(report.ok(), "{:?}", report.problems);
}
