//! The index's transactions, generation and queue.

use std::time::Duration;

use mdl_format::ObjectId;

use super::{Meta, RefValue, HEAD, META_FILE};
use crate::{LockMode, StoreError};

#[test]
fn generation_moves_with_every_committed_write_of_a_holder() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(META_FILE);
    Meta::create(&path).unwrap();
    let meta = Meta::open(&path, LockMode::Write, true, Duration::ZERO).unwrap();
    let g0 = meta.generation().expect("held for writing");
    let mut w = meta.write().unwrap();
    w.set_config("user.name", "a").unwrap();
    drop(w);
    assert_eq!(
        meta.generation(),
        Some(g0),
        "an abandoned write changes nothing"
    );
    let mut w = meta.write().unwrap();
    w.set_config("user.name", "a").unwrap();
    w.commit_txn().unwrap();
    assert_ne!(meta.generation(), Some(g0));
    drop(meta);
    // Not held: another process may write at any time, so nothing can vouch.
    let brief = Meta::open(&path, LockMode::Write, false, Duration::ZERO).unwrap();
    assert_eq!(brief.generation(), None);
    drop(brief);
    let reader = Meta::open(&path, LockMode::Read, true, Duration::ZERO).unwrap();
    assert_eq!(reader.generation(), None);
}

#[test]
fn compare_and_swap_with_reflog() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(META_FILE);
    Meta::create(&path).unwrap();
    let meta = Meta::open(&path, LockMode::Write, true, std::time::Duration::ZERO).unwrap();
    let a = RefValue::Direct(ObjectId::hash(b"a"));
    let b = RefValue::Direct(ObjectId::hash(b"b"));
    let mut w = meta.write().unwrap();
    w.update_ref("refs/heads/x", None, Some(&a), "create")
        .unwrap();
    w.commit_txn().unwrap();
    let mut w = meta.write().unwrap();
    let err = w
        .update_ref("refs/heads/x", Some(&b), Some(&a), "bad")
        .unwrap_err();
    assert!(matches!(err, StoreError::RefConflict { .. }));
    drop(w);
    let mut w = meta.write().unwrap();
    w.update_ref("refs/heads/x", Some(&a), Some(&b), "move")
        .unwrap();
    w.commit_txn().unwrap();
    let r = meta.read().unwrap();
    assert_eq!(r.get_ref("refs/heads/x").unwrap(), Some(b.clone()));
    let log = r.reflog("refs/heads/x").unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(log[1].old, a.target());
    assert_eq!(log[1].new, b.target());
    drop(r);
    let mut w = meta.write().unwrap();
    w.update_ref("refs/heads/x", Some(&b), None, "delete")
        .unwrap();
    w.commit_txn().unwrap();
    let r = meta.read().unwrap();
    assert_eq!(r.get_ref("refs/heads/x").unwrap(), None);
    // The deleted ref's reflog stays, the deletion last, and the journal says the same.
    let log = r.reflog("refs/heads/x").unwrap();
    assert_eq!(log.len(), 3);
    assert_eq!((log[2].old, log[2].new), (b.target(), None));
    assert_eq!(log[2].message, "delete");
    let journal = crate::journal::replay(&dir.path().join(crate::journal::JOURNAL_FILE))
        .unwrap()
        .state;
    assert_eq!(journal, r.journaled().unwrap());
    assert_eq!(journal.reflogs["refs/heads/x"], log);
    assert_eq!(
        r.get_ref(HEAD).unwrap(),
        Some(RefValue::Symbolic("refs/heads/main".into()))
    );
}

/// A stored version a little past this build's is a newer mdl's format, refused as such; one
/// far past it is a flipped bit, reported as damage that a rebuild repairs.
#[test]
fn a_version_from_far_in_the_future_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(META_FILE);
    Meta::create(&path).unwrap();
    let set = |v: u64| {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(super::INFO)
            .unwrap()
            .insert("repo_version", v)
            .unwrap();
        txn.commit().unwrap();
    };
    let open = || Meta::open(&path, LockMode::Read, true, Duration::ZERO).map(drop);
    set(super::REPO_VERSION + 1);
    assert!(matches!(open(), Err(StoreError::NewerFormat { .. })));
    set(super::REPO_VERSION | 1 << 41);
    assert!(matches!(open(), Err(StoreError::Damaged(_))));
    set(super::REPO_VERSION);
    open().unwrap();
}
