//! Background commits: they land in order, each on the one before; a failure surfaces on its
//! handle and on the next submit, and changes nothing; dropping the committer finishes the
//! commit in flight.

#![allow(clippy::disallowed_methods)]

use std::sync::Arc;

use mdl::background::Committer;
use mdl::commit::{CommitOptions, KnownPair, MemoryFile};
use mdl::Repository;

mod common;
use common::safetensors_bytes;

fn state(step: u64) -> Vec<MemoryFile> {
    let w: Vec<u8> = (0..4096u32)
        .flat_map(|i| ((i as f32 + step as f32) * 1e-3).to_le_bytes())
        .collect();
    vec![MemoryFile {
        path: "model.safetensors".into(),
        bytes: safetensors_bytes(&[("w", "F32", vec![64, 64], w)]),
    }]
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
    let repo = Arc::new(Repository::init(&dir.path().join("repo")).unwrap());
    let committer = Committer::new(repo.clone());
    let first = committer.submit(state(1), vec![], opts(1)).unwrap();
    // The second waits for the first, so it lands on top of it.
    let second = committer.submit(state(2), vec![], opts(2)).unwrap();
    assert!(first.done());
    let a = first.wait().unwrap();
    let _third = committer.submit(state(3), vec![], opts(3)).unwrap();
    let b = second.wait().unwrap();
    drop(committer);
    let log = mdl::log::log(&repo, None, None).unwrap();
    let steps: Vec<Option<u64>> = log.iter().map(|e| e.step).collect();
    assert_eq!(steps, [Some(3), Some(2), Some(1)]);
    assert_eq!(log[1].id, b.id);
    assert_eq!(log[2].id, a.id);
}

#[test]
fn a_failure_surfaces_twice_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Arc::new(Repository::init(&dir.path().join("repo")).unwrap());
    let committer = Committer::new(repo.clone());
    let ok = committer.submit(state(1), vec![], opts(1)).unwrap();
    ok.wait().unwrap();
    let bad_pair = KnownPair {
        param: ("model.safetensors".into(), "nope".into()),
        exp_avg: ("model.safetensors".into(), "w".into()),
        exp_avg_sq: ("model.safetensors".into(), "w".into()),
    };
    let failing = committer.submit(state(2), vec![bad_pair], opts(2)).unwrap();
    let e = failing.wait().unwrap_err().to_string();
    assert!(e.contains("nope"), "{e}");
    // The next submit reports it and commits nothing; the one after goes ahead.
    let again = committer
        .submit(state(3), vec![], opts(3))
        .err()
        .expect("the failure is reported again")
        .to_string();
    assert_eq!(again, e);
    assert_eq!(mdl::log::log(&repo, None, None).unwrap().len(), 1);
    committer.submit(state(4), vec![], opts(4)).unwrap();
    assert!(committer.wait().unwrap().is_some());
    let log = mdl::log::log(&repo, None, None).unwrap();
    assert_eq!(
        log.iter().map(|e| e.step).collect::<Vec<_>>(),
        [Some(4), Some(1)]
    );
    assert!(mdl::fsck::fsck(&repo, false).unwrap().ok());
}
