//! Received records kept in packs (`.mdl/packs/`): read back exactly, checked like loose
//! records, found again by an index rebuild, and taken apart by gc once most of a pack is no
//! longer named.

#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use mdl::checkout::{checkout, CheckoutOptions};
use mdl::commit::{commit, CommitOptions};
use mdl::gc::{gc, GcOptions};
use mdl::transfer::{self, RefUpdate, Shallow};
use mdl::{NoProgress, ObjectId, OpenOptions, Repository};

mod common;
use common::{trained_series, write_safetensors, Rng, SeriesShape};

/// The source repositories' series (`trained_series`): a slowly changing checkpoint of small
/// tensors, so every record is small enough to be packed when received; older ones reverse
/// deltas.
const SERIES: SeriesShape = SeriesShape {
    seed: 11,
    len: 40_000,
    every: 3,
    bias: true,
};

/// `src`'s history up to `tip` received into a new repository at `at`, `main` on `tip`.
fn received(src: &Repository, tip: ObjectId, at: &Path) -> Repository {
    let plan = transfer::plan(src, &[tip], &|_| false, &Shallow::WHOLE).unwrap();
    let ids: Vec<ObjectId> = plan.iter().map(|p| p.id).collect();
    let mut pack = Vec::new();
    transfer::write_pack(src, &ids, &mut pack).unwrap();
    let dst = Repository::init(at).unwrap();
    transfer::receive_pack(&dst, &mut &pack[..], u64::MAX).unwrap();
    let update = RefUpdate {
        name: "refs/heads/main".into(),
        old: None,
        new: Some(tip),
        force: false,
    };
    transfer::update_ref(&dst, &update, "test").unwrap();
    dst
}

/// `main` moved back from `from` to `to`, then gc with no grace period: what only `from`'s
/// history named goes.
fn main_back_and_gc(repo: &Repository, from: ObjectId, to: ObjectId) -> mdl::gc::GcOutcome {
    let update = RefUpdate {
        name: "refs/heads/main".into(),
        old: Some(from),
        new: Some(to),
        force: true,
    };
    transfer::update_ref(repo, &update, "test").unwrap();
    let opts = GcOptions {
        prune_older_than: Duration::ZERO,
        expire_reflog: Duration::ZERO,
        ..GcOptions::default()
    };
    gc(repo, &opts, &NoProgress).unwrap()
}

fn packs(repo_dir: &Path) -> Vec<PathBuf> {
    let dir = repo_dir.join(".mdl").join(mdl::PACKS_DIR);
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|l| l.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    out.sort();
    out
}

/// Record files outside packs.
fn loose(repo_dir: &Path) -> usize {
    let objects = repo_dir.join(".mdl").join("objects");
    std::fs::read_dir(objects)
        .unwrap()
        .flatten()
        .filter(|d| d.file_name().len() == 2)
        .map(|d| std::fs::read_dir(d.path()).unwrap().count())
        .sum()
}

/// Every commit of `ids` checks out byte for byte as it does from `src`.
fn same_checkouts(src: &Repository, dst: &Repository, ids: &[ObjectId], scratch: &Path) {
    for (i, id) in ids.iter().enumerate() {
        let (a, b) = (scratch.join(format!("a{i}")), scratch.join(format!("b{i}")));
        let opts = CheckoutOptions::default();
        checkout(src, &id.to_hex(), &a, &opts, &NoProgress).unwrap();
        checkout(dst, &id.to_hex(), &b, &opts, &NoProgress).unwrap();
        assert_eq!(
            std::fs::read(&a).unwrap(),
            std::fs::read(&b).unwrap(),
            "{i}"
        );
        std::fs::remove_file(a).unwrap();
        std::fs::remove_file(b).unwrap();
    }
}

#[test]
fn received_tensors_land_in_packs_and_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (src, ids) = trained_series(dir.path(), 4, &SERIES);
    let at = dir.path().join("dst");
    let dst = received(&src, *ids.last().unwrap(), &at);
    let objects = mdl::inspect::objects(&dst).unwrap();
    let packed = objects.iter().filter(|(_, e)| e.pack.is_some()).count();
    let tensors = objects
        .iter()
        .filter(|(_, e)| e.kind == mdl::ObjectKind::Tensor)
        .count();
    // Every tensor packed; manifests and commits stay loose record files.
    assert_eq!(packed, tensors);
    assert_eq!(loose(&at), objects.len() - tensors);
    assert!(!packs(&at).is_empty());
    same_checkouts(&src, &dst, &ids, dir.path());
    assert!(mdl::fsck::fsck(&dst, false).unwrap().ok());
    // A record read alone is the sender's record, byte for byte.
    for (id, e) in objects.iter().filter(|(_, e)| e.pack.is_some()).take(5) {
        let theirs = mdl::inspect::record(&src, id).unwrap();
        let ours = mdl::inspect::record(&dst, id).unwrap();
        assert_eq!(ours.len() as u64, e.stored_len);
        if mdl::inspect::objects(&src)
            .unwrap()
            .iter()
            .any(|(i, se)| i == id && se.codec == e.codec)
        {
            assert_eq!(ours, theirs);
        }
    }
}

#[test]
fn a_damaged_pack_is_refused_never_read_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let (src, ids) = trained_series(dir.path(), 3, &SERIES);
    let at = dir.path().join("dst");
    let dst = received(&src, *ids.last().unwrap(), &at);
    let (id, e) = mdl::inspect::objects(&dst)
        .unwrap()
        .into_iter()
        .find(|(_, e)| e.pack.is_some() && e.stored_len > 10_000)
        .expect("a large packed record");
    let path = mdl::inspect::record_path(&dst, &id).unwrap();
    let good = std::fs::read(&path).unwrap();
    let at_byte = (e.pack.unwrap().offset + e.stored_len / 2) as usize;
    let mut bad = good.clone();
    bad[at_byte] ^= 0x08;
    std::fs::write(&path, &bad).unwrap();
    let err = mdl::inspect::content(&dst, &id).unwrap_err();
    assert!(err.to_string().contains(&id.to_hex()[..12]), "{err}");
    assert!(!mdl::fsck::fsck(&dst, false).unwrap().ok());
    // Cut short: the records past the end are an error, the ones before it still read.
    std::fs::write(&path, &good[..at_byte]).unwrap();
    assert!(mdl::inspect::content(&dst, &id).is_err());
    std::fs::write(&path, &good).unwrap();
    assert!(mdl::fsck::fsck(&dst, false).unwrap().ok());
}

#[test]
fn an_index_rebuilt_from_disk_finds_the_records_in_packs() {
    let dir = tempfile::tempdir().unwrap();
    let (src, ids) = trained_series(dir.path(), 3, &SERIES);
    let at = dir.path().join("dst");
    let dst = received(&src, *ids.last().unwrap(), &at);
    let before = mdl::inspect::objects(&dst).unwrap();
    drop(dst);
    std::fs::remove_file(at.join(".mdl").join("meta.redb")).unwrap();
    let (rebuilt, report) = mdl::fsck::repair(&at, &OpenOptions::default()).unwrap();
    let rebuilt = rebuilt.expect("the index was rebuilt");
    assert!(rebuilt.unusable.is_empty(), "{:?}", rebuilt.unusable);
    assert!(report.ok());
    let dst = Repository::open(&at, &OpenOptions::default()).unwrap();
    let after = mdl::inspect::objects(&dst).unwrap();
    assert_eq!(after.len(), before.len());
    for ((a, ea), (b, eb)) in before.iter().zip(&after) {
        assert_eq!(a, b);
        assert_eq!(
            (ea.pack, ea.stored_len, ea.depth),
            (eb.pack, eb.stored_len, eb.depth)
        );
    }
    same_checkouts(&src, &dst, &ids, dir.path());
}

#[test]
fn gc_takes_apart_a_pack_mostly_unnamed_and_removes_one_unnamed() {
    let dir = tempfile::tempdir().unwrap();
    let (src, ids) = trained_series(dir.path(), 4, &SERIES);
    let at = dir.path().join("dst");
    let dst = received(&src, ids[3], &at);
    // A copy of a pack under a number no entry names: a leftover.
    let first = packs(&at)[0].clone();
    let stray = first.with_file_name("00000000000000aa.pack");
    std::fs::copy(&first, &stray).unwrap();
    // Only the first commit stays reachable: most of every pack's records go.
    let out = main_back_and_gc(&dst, ids[3], ids[0]);
    assert!(out.commits >= 3, "{out:?}");
    assert!(!stray.exists(), "a pack nothing names is a leftover");
    // Whatever pack is left is mostly named; what lives is read back exactly.
    let objects = mdl::inspect::objects(&dst).unwrap();
    for p in packs(&at) {
        let len = std::fs::metadata(&p).unwrap().len();
        let named: u64 = objects
            .iter()
            .filter(|(id, e)| e.pack.is_some() && mdl::inspect::record_path(&dst, id).unwrap() == p)
            .map(|(_, e)| e.stored_len)
            .sum();
        assert!(
            named * 2 >= len,
            "{}: {named} of {len} bytes named",
            p.display()
        );
    }
    same_checkouts(&src, &dst, &ids[..1], dir.path());
    assert!(mdl::fsck::fsck(&dst, false).unwrap().ok());
}

#[test]
fn gc_moves_the_few_named_records_of_a_pack_out_and_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let src = Repository::init(&dir.path().join("src")).unwrap();
    let mut rng = Rng(5);
    let keep: Vec<u8> = (0..64)
        .flat_map(|_| (rng.normal() as f32).to_le_bytes())
        .collect();
    let big: Vec<u8> = (0..40_000)
        .flat_map(|_| (rng.normal() as f32).to_le_bytes())
        .collect();
    let mut ids = Vec::new();
    for (step, tensors) in [
        vec![("keep", "F32", vec![64], keep.clone())],
        vec![
            ("keep", "F32", vec![64], keep.clone()),
            ("big", "F32", vec![40_000], big.clone()),
        ],
    ]
    .into_iter()
    .enumerate()
    {
        let f = dir.path().join(format!("c{step}.safetensors"));
        write_safetensors(&f, &tensors);
        let opts = CommitOptions {
            message: format!("step {step}"),
            ..CommitOptions::default()
        };
        ids.push(commit(&src, &f, &opts, &NoProgress).unwrap().id);
    }
    let at = dir.path().join("dst");
    let dst = received(&src, ids[1], &at);
    assert_eq!(packs(&at).len(), 1);
    let packed = |repo: &Repository| -> Vec<ObjectId> {
        mdl::inspect::objects(repo)
            .unwrap()
            .into_iter()
            .filter(|(_, e)| e.pack.is_some())
            .map(|(id, _)| id)
            .collect()
    };
    assert_eq!(packed(&dst).len(), 2, "keep and big, packed together");
    let pack_len = std::fs::metadata(&packs(&at)[0]).unwrap().len();
    // Back to the first commit: `big` goes, `keep` is all the pack still names.
    let out = main_back_and_gc(&dst, ids[1], ids[0]);
    assert_eq!(out.tensors, 1, "{out:?}");
    // The pack's bytes, less the record moved out, and the dropped commit's loose records.
    assert!(out.bytes_freed > pack_len / 2, "{out:?}");
    assert!(out.bytes_freed < pack_len + 10_000, "{out:?}");
    assert!(packs(&at).is_empty(), "the pack was taken apart");
    assert!(packed(&dst).is_empty());
    same_checkouts(&src, &dst, &ids[..1], dir.path());
    assert!(mdl::fsck::fsck(&dst, false).unwrap().ok());
}
