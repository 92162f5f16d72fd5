//! Readers beside a writer: while a commit is at work, `log`, `show` and `checkout` of an
//! existing commit open the repository and answer without waiting for it (opened with no
//! patience at all), a second writer still has to wait its turn, and the commit then publishes
//! as usual. Opens in one process lock the same way as opens in two (file locks belong to the
//! open file, not the process), so this is what two processes see.

// Tests, examples and benchmarks write their own files (checkpoints, outputs, damage done on
// purpose); the rule that repository writes go through mdl-store is for the library crates.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mdl::checkout::{checkout, CheckoutOptions};
use mdl::commit::{commit, CommitOptions};
use mdl::{Error, LockMode, NoProgress, ObjectId, OpenOptions, Progress, Repository, StoreError};

mod common;
use common::{write_safetensors, Rng};

/// Runs `f` once, from the first progress report of the work it is given to.
struct During<F> {
    f: F,
    ran: AtomicBool,
}

impl<F: Fn() + Sync> Progress for During<F> {
    fn start(&self, _: &str, _: u64) {}
    fn advance(&self, _: u64) {
        if !self.ran.swap(true, Ordering::SeqCst) {
            (self.f)();
        }
    }
    fn finish(&self) {}
}

fn checkpoint(path: &Path, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    let tensors: Vec<_> = (0..4)
        .map(|k| {
            let values: Vec<u8> = (0..250_000)
                .flat_map(|_| ((rng.normal() * 0.02) as f32).to_le_bytes())
                .collect();
            (["a", "b", "c", "d"][k], "F32", vec![500, 500], values)
        })
        .collect();
    write_safetensors(path, &tensors);
    std::fs::read(path).unwrap()
}

fn now(mode: LockMode) -> OpenOptions {
    OpenOptions {
        mode,
        wait: Duration::ZERO,
        ..OpenOptions::default()
    }
}

fn checked_out(repo: &Repository, id: &ObjectId, out: &Path) -> Vec<u8> {
    let force = CheckoutOptions {
        force: true,
        ..Default::default()
    };
    checkout(repo, &id.to_hex(), out, &force, &NoProgress).unwrap();
    std::fs::read(out).unwrap()
}

#[test]
fn readers_do_not_wait_for_a_commit_at_work() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    Repository::init(&root).unwrap();
    let (one, two) = (
        dir.path().join("1.safetensors"),
        dir.path().join("2.safetensors"),
    );
    let first_bytes = checkpoint(&one, 1);
    let second_bytes = checkpoint(&two, 2);
    let opts = CommitOptions::default();
    let first = {
        let repo = Repository::open(&root, &now(LockMode::Write)).unwrap();
        commit(&repo, &one, &opts, &NoProgress).unwrap().id
    };

    let out = dir.path().join("out.safetensors");
    let writer = Repository::open(&root, &now(LockMode::Write)).unwrap();
    let reads = During {
        f: || {
            let reader = Repository::open(&root, &now(LockMode::Read))
                .expect("a reader opens beside a commit at work");
            let log = mdl::log::log(&reader, None, None).unwrap();
            assert_eq!(log.iter().map(|e| e.id).collect::<Vec<_>>(), [first]);
            assert_eq!(mdl::show::show(&reader, "HEAD").unwrap().id, first);
            assert_eq!(checked_out(&reader, &first, &out), first_bytes);
            // Writers still take turns.
            let second = Repository::open(&root, &now(LockMode::Write));
            assert!(
                matches!(second, Err(Error::Store(StoreError::Busy { .. }))),
                "a second writer opened beside a commit at work"
            );
        },
        ran: AtomicBool::new(false),
    };
    let second = commit(&writer, &two, &opts, &reads).unwrap().id;
    assert!(
        reads.ran.load(Ordering::SeqCst),
        "the commit reported no progress"
    );
    drop(writer);

    let reader = Repository::open(&root, &now(LockMode::Read)).unwrap();
    let log = mdl::log::log(&reader, None, None).unwrap();
    assert_eq!(
        log.iter().map(|e| e.id).collect::<Vec<_>>(),
        [second, first]
    );
    assert_eq!(checked_out(&reader, &second, &out), second_bytes);
    let report = mdl::fsck::fsck(&reader, false).unwrap();
    assert!(report.ok(), "{:?}", report.problems);
}

/// A reader's open transaction keeps a writer's publish waiting for as long as the writer's
/// patience lasts (here none: it fails as busy), and nothing of a publish that gave up is
/// visible afterwards; once the reader lets go the same commit goes through, and readers read
/// it at once, the writer still holding the repository.
#[test]
fn a_publish_waits_for_open_read_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    Repository::init(&root).unwrap();
    let one = dir.path().join("1.safetensors");
    checkpoint(&one, 1);
    let reader = Repository::open(&root, &now(LockMode::Read)).unwrap();
    let writer = Repository::open(&root, &now(LockMode::Write)).unwrap();
    // What a reader's transaction holds of the database file.
    let database = redb::ReadOnlyDatabase::open(root.join(".mdl/meta.redb")).unwrap();
    let held = redb::ReadableDatabase::begin_read(&database).unwrap();
    drop(database);
    let e = commit(&writer, &one, &CommitOptions::default(), &NoProgress).unwrap_err();
    assert!(
        matches!(e, Error::Store(StoreError::Busy { .. })),
        "the publish did not wait for the reader: {e}"
    );
    drop(held);
    assert!(mdl::log::log(&reader, None, None).unwrap().is_empty());
    // Once the reader lets go, the same commit publishes.
    commit(&writer, &one, &CommitOptions::default(), &NoProgress).unwrap();
    // A process that has published lets go of the database with its publish: readers read
    // while it still holds the repository (maintenance after a commit, issue 68).
    assert_eq!(mdl::log::log(&reader, None, None).unwrap().len(), 1);
    drop(writer);
    assert_eq!(mdl::log::log(&reader, None, None).unwrap().len(), 1);
}
