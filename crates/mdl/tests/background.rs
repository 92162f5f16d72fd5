//! Background commits: they land in order, each on the one before; a failure (a full disk)
//! surfaces on its handle and on the next submit, and changes nothing; dropping the committer finishes the
//! commit in flight.

#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::sync::Arc;

use mdl::background::Committer;
use mdl::commit::{CommitOptions, MemoryFile, Staged};
use mdl::{OpenOptions, Repository};

mod common;
use common::faulty::FaultyFs;
use common::safetensors_bytes;

fn state(step: u64) -> Vec<MemoryFile> {
    let w: Vec<u8> = (0..4096u32)
        .flat_map(|i| ((i as f32 + step as f32) * 1e-3).to_le_bytes())
        .collect();
    vec![MemoryFile::new(
        "model.safetensors",
        safetensors_bytes(&[("w", "F32", vec![64, 64], w)]),
    )]
}

fn committer_for(root: &Path, opts: OpenOptions) -> Committer {
    let root = root.to_path_buf();
    Committer::new(move || Repository::open(&root, &opts))
}

fn opts(step: u64) -> CommitOptions {
    CommitOptions {
        step: Some(step),
        message: format!("step {step}"),
        ..Default::default()
    }
}

#[test]
fn commits_land_in_order_and_drop_finishes_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    Repository::init(&root).unwrap();
    let committer = committer_for(&root, OpenOptions::default());
    let first = committer
        .submit(Staged::memory(state(1), &[]).unwrap(), opts(1))
        .unwrap();
    // The second waits for the first, so it lands on top of it.
    let second = committer
        .submit(Staged::memory(state(2), &[]).unwrap(), opts(2))
        .unwrap();
    assert!(first.done());
    let a = first.wait().unwrap();
    let _third = committer
        .submit(Staged::memory(state(3), &[]).unwrap(), opts(3))
        .unwrap();
    let b = second.wait().unwrap();
    drop(committer);
    let repo = Repository::open(&root, &OpenOptions::default()).unwrap();
    let log = mdl::log::log(&repo, None, None).unwrap();
    let steps: Vec<Option<u64>> = log.iter().map(|e| e.step).collect();
    assert_eq!(steps, [Some(3), Some(2), Some(1)]);
    assert_eq!(log[1].id, b.id);
    assert_eq!(log[2].id, a.id);
}

#[test]
fn a_failure_surfaces_twice_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    Repository::init(&root).unwrap();
    committer_for(&root, OpenOptions::default())
        .submit(Staged::memory(state(1), &[]).unwrap(), opts(1))
        .unwrap()
        .wait()
        .unwrap();
    // The disk is full: the background commit fails.
    let full = OpenOptions {
        storage: Arc::new(FaultyFs::disk_full_after(0)),
        ..OpenOptions::default()
    };
    let committer = committer_for(&root, full);
    let failing = committer
        .submit(Staged::memory(state(2), &[]).unwrap(), opts(2))
        .unwrap();
    let e = failing.wait().unwrap_err().to_string();
    assert!(e.starts_with("background commit failed: "), "{e}");
    // The next submit reports it and commits nothing.
    let again = committer
        .submit(Staged::memory(state(3), &[]).unwrap(), opts(3))
        .err()
        .expect("the failure is reported again")
        .to_string();
    assert_eq!(again, e);
    // Between commits the committer holds no lock: another writer opens at once. (Not with
    // no wait at all: a child process the failed commit started, its author lookup, holds a
    // copy of the lock's descriptor from its fork until its exec.)
    let now = OpenOptions {
        wait: std::time::Duration::from_secs(2),
        ..OpenOptions::default()
    };
    drop(Repository::open(&root, &now).unwrap());
    drop(committer);
    let repo = Repository::open(&root, &OpenOptions::default()).unwrap();
    let log = mdl::log::log(&repo, None, None).unwrap();
    assert_eq!(log.iter().map(|e| e.step).collect::<Vec<_>>(), [Some(1)]);
    let report = mdl::fsck::fsck(&repo, false).unwrap();
    assert!(report.ok(), "{:?}", report.problems);
    assert!(report.temp_files.is_empty(), "{:?}", report.temp_files);
    drop(repo);
    // On a disk with room, the one after goes ahead.
    let committer = committer_for(&root, OpenOptions::default());
    committer
        .submit(Staged::memory(state(4), &[]).unwrap(), opts(4))
        .unwrap();
    assert!(committer.finish().unwrap().is_some());
    assert!(committer.finish().unwrap().is_none());
    let repo = Repository::open(&root, &OpenOptions::default()).unwrap();
    let log = mdl::log::log(&repo, None, None).unwrap();
    assert_eq!(
        log.iter().map(|e| e.step).collect::<Vec<_>>(),
        [Some(4), Some(1)]
    );
}
