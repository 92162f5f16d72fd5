//! Disk-full and failed-rename faults during a commit (or a deferred re-encode) leave the
//! repository exactly as it was, the records written before the fault removed again.

// Tests, examples and benchmarks write their own files (checkpoints, outputs, damage done on
// purpose); the rule that repository writes go through mdl-store is for the library crates.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;

use mdl::commit::{commit, CommitOptions};
use mdl::policy::DeltaPolicy;
use mdl::{NoProgress, OpenOptions, Repository};

mod common;
use common::faulty::FaultyFs;
use common::write_safetensors;

fn checkpoint(path: &std::path::Path, seed: u8) {
    let n = 200_000usize;
    let mut x = seed as u64 | 1;
    let mut noise = || -> Vec<u8> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    let (a, b) = (noise(), noise());
    write_safetensors(
        path,
        &[
            ("a", "U8", vec![n as u64], a),
            ("b", "U8", vec![n as u64], b),
        ],
    );
}

#[test]
fn faults_leave_repository_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path()).unwrap();
    let f = dir.path().join("c.safetensors");
    checkpoint(&f, 3);
    let first = commit(&repo, &f, &CommitOptions::default(), &NoProgress).unwrap();
    drop(repo);
    checkpoint(&f, 7);
    let faults = [
        FaultyFs::disk_full_after(0),
        FaultyFs::disk_full_after(1000),
        FaultyFs::disk_full_after(150_000),
        FaultyFs::disk_full_after(250_000),
        FaultyFs::renames_fail_after(0),
        FaultyFs::renames_fail_after(1),
        FaultyFs::renames_fail_after(2),
        FaultyFs::syncs_fail_after(0),
        FaultyFs::syncs_fail_after(1),
    ];
    for fault in faults {
        let opts = OpenOptions {
            storage: Arc::new(fault),
            ..OpenOptions::default()
        };
        let repo = Repository::open(dir.path(), &opts).unwrap();
        let err = commit(&repo, &f, &CommitOptions::default(), &NoProgress).unwrap_err();
        assert!(!err.to_string().contains('\n'));
        assert_eq!(
            mdl::revision::resolve(&repo, "main").unwrap(),
            first.id,
            "{err}"
        );
        assert_eq!(mdl::log::log(&repo, None, None).unwrap().len(), 1);
        assert_nothing_left(&repo, &err.to_string());
    }
    // The same commit succeeds once the disk has room again.
    let repo = Repository::open(dir.path(), &OpenOptions::default()).unwrap();
    let second = commit(&repo, &f, &CommitOptions::default(), &NoProgress).unwrap();
    assert_eq!(mdl::revision::resolve(&repo, "main~1").unwrap(), first.id);
    assert_eq!(mdl::revision::resolve(&repo, "main").unwrap(), second.id);
    assert!(mdl::fsck::fsck(&repo, false).unwrap().ok());
}

/// The repository checks out and holds nothing of the failed write: no temporary file and no
/// record the index does not name (the failure took them back, so the space is free at once).
fn assert_nothing_left(repo: &Repository, why: &str) {
    let report = mdl::fsck::fsck(repo, false).unwrap();
    assert!(report.ok(), "{why}: {:?}", report.problems);
    assert!(
        report.temp_files.is_empty(),
        "{why}: temporary files left behind: {:?}",
        report.temp_files
    );
    assert_eq!(report.unindexed_records, 0, "{why}: records left behind");
}

/// A float checkpoint whose single tensor moves a little with `step`, so the second commit
/// re-encodes the first one's record as a reverse delta.
fn float_checkpoint(path: &std::path::Path, step: u32) {
    let n = 100_000usize;
    let data: Vec<u8> = (0..n)
        .flat_map(|i| {
            (((i as f32) * 0.37).sin() * 0.02 + step as f32 * 1e-7 * ((i % 7) as f32)).to_le_bytes()
        })
        .collect();
    write_safetensors(path, &[("w", "F32", vec![n as u64], data)]);
}

/// Checks out `rev` into `dir` and compares it with `original` (the file is removed after).
fn assert_checks_out(repo: &Repository, rev: &str, dir: &std::path::Path, original: &[u8]) {
    let out = dir.join("out.safetensors");
    mdl::checkout::checkout(repo, rev, &out, &Default::default(), &NoProgress).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), original, "{rev}");
    std::fs::remove_file(&out).unwrap();
}

/// Eager reverse deltas: the commit itself re-encodes the previous version.
fn eager() -> CommitOptions {
    CommitOptions {
        delta: Some(DeltaPolicy {
            defer: false,
            ..DeltaPolicy::default()
        }),
        ..CommitOptions::default()
    }
}

#[test]
fn faults_during_a_reverse_delta_leave_the_old_record_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path()).unwrap();
    let f = dir.path().join("c.safetensors");
    float_checkpoint(&f, 0);
    let original = std::fs::read(&f).unwrap();
    let first = commit(&repo, &f, &eager(), &NoProgress).unwrap();
    drop(repo);
    float_checkpoint(&f, 1);
    for fault in [
        FaultyFs::disk_full_after(200_000),
        FaultyFs::disk_full_after(400_000),
        FaultyFs::renames_fail_after(1),
        FaultyFs::renames_fail_after(2),
        FaultyFs::syncs_fail_after(0),
        FaultyFs::syncs_fail_after(2),
    ] {
        let opts = OpenOptions {
            storage: Arc::new(fault),
            ..OpenOptions::default()
        };
        let repo = Repository::open(dir.path(), &opts).unwrap();
        let err = commit(&repo, &f, &eager(), &NoProgress).unwrap_err();
        assert_eq!(mdl::revision::resolve(&repo, "main").unwrap(), first.id);
        assert_checks_out(&repo, "main", dir.path(), &original);
        let shown = mdl::show::show(&repo, "main").unwrap();
        assert_eq!(
            shown.tensors[0].codec, "float-split",
            "the old record is still in use"
        );
        assert_nothing_left(&repo, &err.to_string());
    }
    let repo = Repository::open(dir.path(), &OpenOptions::default()).unwrap();
    commit(&repo, &f, &eager(), &NoProgress).unwrap();
    let shown = mdl::show::show(&repo, "main~1").unwrap();
    assert!(
        shown.tensors[0].codec.ends_with("-delta"),
        "{}",
        shown.tensors[0].codec
    );
    assert_checks_out(&repo, "main~1", dir.path(), &original);
    let report = mdl::fsck::fsck(&repo, false).unwrap();
    assert!(report.ok(), "{:?}", report.problems);
}

/// The same faults during a deferred re-encode (`delta.defer`, the default): the old record
/// stays in use, the work stays queued, and a run without faults finishes it.
#[test]
fn faults_during_a_deferred_reencode_leave_it_queued() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path()).unwrap();
    let f = dir.path().join("c.safetensors");
    float_checkpoint(&f, 0);
    let original = std::fs::read(&f).unwrap();
    commit(&repo, &f, &CommitOptions::default(), &NoProgress).unwrap();
    float_checkpoint(&f, 1);
    commit(&repo, &f, &CommitOptions::default(), &NoProgress).unwrap();
    assert_eq!(mdl::commit::pending_deferred(&repo).unwrap(), 1);
    drop(repo);
    for fault in [
        FaultyFs::disk_full_after(1_000),
        FaultyFs::renames_fail_after(0),
        FaultyFs::syncs_fail_after(0),
    ] {
        let opts = OpenOptions {
            storage: Arc::new(fault),
            ..OpenOptions::default()
        };
        let repo = Repository::open(dir.path(), &opts).unwrap();
        let err = mdl::commit::run_deferred(&repo, None, &|| false).unwrap_err();
        assert_eq!(mdl::commit::pending_deferred(&repo).unwrap(), 1);
        let shown = mdl::show::show(&repo, "main~1").unwrap();
        assert_eq!(
            shown.tensors[0].codec, "float-split",
            "the old record is still in use"
        );
        assert_checks_out(&repo, "main~1", dir.path(), &original);
        assert_nothing_left(&repo, &err.to_string());
    }
    let repo = Repository::open(dir.path(), &OpenOptions::default()).unwrap();
    let report = mdl::commit::run_deferred(&repo, None, &|| false).unwrap();
    assert_eq!((report.rewritten, report.pending), (1, 0));
    let shown = mdl::show::show(&repo, "main~1").unwrap();
    assert!(shown.tensors[0].codec.ends_with("-delta"));
    assert_checks_out(&repo, "main~1", dir.path(), &original);
    assert!(mdl::fsck::fsck(&repo, false).unwrap().ok());
}
