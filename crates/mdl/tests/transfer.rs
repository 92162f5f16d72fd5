//! Moving history between repositories through the library: a pack of a delta series makes
//! an identical copy; tampered, truncated or incomplete packs are refused with no ref or
//! commit changed; ref updates are compare-and-swap and fast-forward only.

#![allow(clippy::disallowed_methods)]

use std::path::Path;

use mdl::checkout::{checkout, CheckoutOptions};
use mdl::commit::{commit, CommitOptions};
use mdl::transfer::{self, RefUpdate, Shallow};
use mdl::{Error, NoProgress, ObjectId, Repository, StoreError};

mod common;
use common::{trained_series, SeriesShape};

/// The source repositories' series (`trained_series`): a slowly changing f32 checkpoint, so
/// tensors are deltas.
const SERIES: SeriesShape = SeriesShape {
    seed: 7,
    len: 50_000,
    every: 5,
    bias: false,
};

fn pack(repo: &Repository, tip: ObjectId) -> Vec<u8> {
    let plan = transfer::plan(repo, &[tip], &|_| false, &Shallow::WHOLE).unwrap();
    let ids: Vec<ObjectId> = plan.iter().map(|p| p.id).collect();
    let mut out = Vec::new();
    transfer::write_pack(repo, &ids, &mut out).unwrap();
    out
}

/// Moves `name` from `old` to `new` as a push would.
fn set_ref(
    repo: &Repository,
    name: &str,
    old: Option<ObjectId>,
    new: ObjectId,
    force: bool,
) -> mdl::Result<()> {
    let update = RefUpdate {
        name: name.into(),
        old,
        new: Some(new),
        force,
    };
    transfer::update_ref(repo, &update, "test")
}

fn commits(repo: &Repository) -> usize {
    transfer::commits(repo).unwrap().len()
}

#[test]
fn a_pack_copies_history_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (src, ids) = trained_series(dir.path(), 4, &SERIES);
    let tip = *ids.last().unwrap();
    let depth = mdl::inspect::objects(&src)
        .unwrap()
        .iter()
        .map(|(_, e)| e.depth)
        .max()
        .unwrap();
    assert!(depth > 0, "the series should contain deltas");

    let dst = Repository::init(&dir.path().join("dst")).unwrap();
    let got = transfer::receive_pack(&dst, &mut &pack(&src, tip)[..], u64::MAX)
        .unwrap()
        .received;
    assert_eq!(got.commits.len(), 4);
    set_ref(&dst, "refs/heads/main", None, tip, false).unwrap();
    for (i, id) in ids.iter().enumerate() {
        let a = dir.path().join(format!("a{i}"));
        let b = dir.path().join(format!("b{i}"));
        let opts = CheckoutOptions::default();
        checkout(&src, &id.to_hex(), &a, &opts, &NoProgress).unwrap();
        checkout(&dst, &id.to_hex(), &b, &opts, &NoProgress).unwrap();
        assert_eq!(std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    }
    assert!(mdl::fsck::fsck(&dst, false).unwrap().ok());

    // Only what is missing: nothing new to send for a receiver that has the tip's parent.
    let rest = transfer::plan(&src, &[tip], &|id| *id == ids[2], &Shallow::WHOLE).unwrap();
    let all = transfer::plan(&src, &[tip], &|_| false, &Shallow::WHOLE).unwrap();
    assert!(rest.len() < all.len());
    assert_eq!(rest.last().unwrap().id, tip);
}

#[test]
fn bad_packs_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (src, ids) = trained_series(dir.path(), 3, &SERIES);
    let tip = *ids.last().unwrap();
    let good = pack(&src, tip);
    let dst = Repository::init(&dir.path().join("dst")).unwrap();

    // Truncated anywhere after the magic: refused, no commit becomes known, and nothing is
    // kept (a pushed pack is whole or refused; only a fetch keeps what came before a cut).
    for cut in [8, 50, good.len() / 2, good.len() - 41, good.len() - 1] {
        let err = transfer::receive_pack(&dst, &mut &good[..cut], u64::MAX).unwrap_err();
        assert!(matches!(err, Error::BadTransfer(_)), "{err}");
        assert_eq!(commits(&dst), 0);
        assert!(mdl::inspect::objects(&dst).unwrap().is_empty());
    }
    // A flipped byte inside a record: the checksum or the re-hash catches it. (Fresh
    // receivers: objects a failed transfer already verified and indexed are skipped.)
    for (i, at) in [60, good.len() / 3, good.len() - 200]
        .into_iter()
        .enumerate()
    {
        let fresh = Repository::init(&dir.path().join(format!("flip{i}"))).unwrap();
        let mut bad = good.clone();
        bad[at] ^= 0x10;
        let err = transfer::receive_pack(&fresh, &mut &bad[..], u64::MAX).unwrap_err();
        assert!(matches!(err, Error::BadTransfer(_)), "{err}");
        assert_eq!(commits(&fresh), 0);
        assert!(mdl::fsck::fsck(&fresh, false).unwrap().ok());
    }
    // A record over the size limit.
    let err = transfer::receive_pack(&dst, &mut &good[..], 16).unwrap_err();
    assert!(err.to_string().contains("over the limit"), "{err}");
    // Commits without their tensors: the manifest names objects that were not sent.
    let plan = transfer::plan(&src, &[tip], &|_| false, &Shallow::WHOLE).unwrap();
    let tail: Vec<ObjectId> = plan
        .iter()
        .map(|p| p.id)
        .filter(|id| {
            mdl::inspect::object(&src, id).unwrap().unwrap().kind != mdl_format::ObjectKind::Tensor
        })
        .collect();
    let fresh = Repository::init(&dir.path().join("fresh")).unwrap();
    let mut only_tail = Vec::new();
    transfer::write_pack(&src, &tail, &mut only_tail).unwrap();
    let err = transfer::receive_pack(&fresh, &mut &only_tail[..], u64::MAX).unwrap_err();
    assert!(matches!(err, Error::Incomplete(_)), "{err}");
    assert_eq!(commits(&fresh), 0);
    // A ref cannot point at a commit that is not there.
    let err = set_ref(&fresh, "refs/heads/main", None, tip, false).unwrap_err();
    assert!(matches!(err, Error::Incomplete(_)), "{err}");
    // After all that, the good pack still goes in.
    transfer::receive_pack(&dst, &mut &good[..], u64::MAX).unwrap();
    assert_eq!(commits(&dst), 3);
    assert!(mdl::fsck::fsck(&dst, false).unwrap().ok());
}

/// The frames of a pack: each record's range in it.
fn records(pack: &[u8]) -> Vec<std::ops::Range<usize>> {
    let (mut at, mut out) = (8, Vec::new());
    loop {
        let len = u64::from_le_bytes(pack[at + 32..at + 40].try_into().unwrap());
        if len == 0 || len == u64::MAX {
            return out;
        }
        out.push(at + 40..at + 40 + len as usize);
        at += 40 + len as usize;
    }
}

/// A delta deep in a chain, re-made with a valid checksum around altered bytes: the receiver
/// decodes it against the level it verified just before (held decoded, not decoded again), and
/// still refuses it by its content hash.
#[test]
fn an_altered_delta_deep_in_a_chain_is_refused() {
    use mdl_format::record;
    let dir = tempfile::tempdir().unwrap();
    let (src, ids) = trained_series(dir.path(), 4, &SERIES);
    let good = pack(&src, *ids.last().unwrap());
    let deltas: Vec<_> = records(&good)
        .into_iter()
        .filter(|r| record::decode(&good[r.clone()]).unwrap().0.base.is_some())
        .collect();
    assert!(deltas.len() >= 2, "a chain of deltas");
    for r in [deltas[deltas.len() - 1].clone(), deltas[0].clone()] {
        let mut bad = good.clone();
        let (header, payload, trailer) = record::decode(&good[r.clone()]).unwrap();
        let mut altered = payload.to_vec();
        let at = altered.len() - 20;
        altered[at] ^= 0x04;
        bad[r].copy_from_slice(&record::encode(&header, &altered, trailer.content_len));
        let fresh = Repository::init(&dir.path().join(format!("r{}", deltas.len()))).unwrap();
        let err = transfer::receive_pack(&fresh, &mut &bad[..], u64::MAX).unwrap_err();
        assert!(matches!(err, Error::BadTransfer(_)), "{err}");
        assert_eq!(commits(&fresh), 0);
        assert!(mdl::fsck::fsck(&fresh, false).unwrap().ok());
        drop(fresh);
        std::fs::remove_dir_all(dir.path().join(format!("r{}", deltas.len()))).unwrap();
    }
}

#[test]
fn ref_updates_are_compare_and_swap_and_fast_forward() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, ids) = trained_series(dir.path(), 3, &SERIES);
    let update = |old, new, force| set_ref(&repo, "refs/heads/main", old, new, force);
    // Backwards is not a fast-forward unless forced.
    let err = update(Some(ids[2]), ids[0], false).unwrap_err();
    assert!(matches!(err, Error::NotFastForward { .. }), "{err}");
    // A stale expected value is a conflict.
    let err = update(Some(ids[1]), ids[2], false).unwrap_err();
    assert!(
        matches!(err, Error::Store(StoreError::RefConflict { .. })),
        "{err}"
    );
    update(Some(ids[2]), ids[0], true).unwrap();
    update(Some(ids[0]), ids[2], false).unwrap();
    // Names outside refs/heads and refs/tags, or invalid ones, are refused.
    for name in [
        "HEAD",
        "refs/remotes/x/main",
        "refs/heads/../x",
        "refs/heads/a b",
    ] {
        let r = set_ref(&repo, name, None, ids[0], true);
        assert!(r.is_err(), "{name} accepted");
    }
}

/// What a malicious server could send a client (`clone`, `fetch`, `pull` receive packs with
/// the same code): lengths that lie are refused before anything that size is allocated.
#[test]
fn packs_that_lie_about_lengths_are_refused_before_allocating() {
    use mdl_format::record::{encode, RecordHeader};
    use mdl_format::{Dtype, ObjectKind, TensorHeader};
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(&dir.path().join("r")).unwrap();
    let frame = |id: u8, record: &[u8], claimed: u64| {
        let mut p = transfer::PACK_MAGIC.to_vec();
        p.extend_from_slice(&[id; 32]);
        p.extend_from_slice(&claimed.to_le_bytes());
        p.extend_from_slice(record);
        p.extend_from_slice(&[0u8; 40]);
        p
    };
    // Every plane a constant stream: a few dozen bytes for `elems` f32 zeros.
    let constant = |elems: u64, claimed: u64| {
        let mut payload = vec![4u8, 0];
        for _ in 0..4 {
            payload.extend_from_slice(&2u64.to_le_bytes());
        }
        for _ in 0..4 {
            payload.extend_from_slice(&[1, 0]);
        }
        let prefix = TensorHeader::new(Dtype::F32, vec![elems]).canonical();
        encode(
            &RecordHeader::new(ObjectKind::Tensor, 2, None, prefix),
            &payload,
            claimed,
        )
    };
    let cases = [
        ("ends early", frame(1, b"", 60 << 30)),
        ("cannot hold", {
            let r = constant(16, 1 << 40);
            frame(2, &r, r.len() as u64)
        }),
        ("decode to", {
            let r = constant(1 << 28, 1 << 30);
            frame(3, &r, r.len() as u64)
        }),
    ];
    for (want, pack) in cases {
        let err = transfer::receive_pack(&repo, &mut &pack[..], u64::MAX).unwrap_err();
        assert!(matches!(err, Error::BadTransfer(_)), "{err}");
        assert!(err.to_string().contains(want), "{want}: {err}");
    }
    assert!(mdl::fsck::fsck(&repo, false).unwrap().ok());
}

/// A receiver holding commit k gets commit k + 1's changed tensor coded against the version it
/// holds: a record naming that base, smaller than the one stored, that the receiver takes and
/// verifies, and from which it checks out commit k + 1 exactly.
#[test]
fn a_tensor_goes_as_a_delta_against_the_version_the_receiver_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (src, ids) = trained_series(dir.path(), 2, &SERIES);
    let held = ids[1];
    // The receiver holds both commits.
    let dst = Repository::init(&dir.path().join("dst")).unwrap();
    transfer::receive_pack(&dst, &mut &pack(&src, held)[..], u64::MAX).unwrap();
    // The next step changes a tenth of the elements a little.
    let before = std::fs::read(dir.path().join("c1.safetensors")).unwrap();
    let header = 8 + u64::from_le_bytes(before[..8].try_into().unwrap()) as usize;
    let mut next = before.clone();
    for k in (header..next.len() - 8).step_by(40) {
        next[k] ^= 0x10;
    }
    let f = dir.path().join("c2.safetensors");
    std::fs::write(&f, &next).unwrap();
    let opts = CommitOptions {
        message: "step 2".into(),
        ..CommitOptions::default()
    };
    let tip = commit(&src, &f, &opts, &NoProgress).unwrap().id;
    mdl::commit::run_deferred(&src, None, &|| false).unwrap();

    let has = |id: &ObjectId| ids.contains(id);
    let mut plan = transfer::plan(&src, &[tip], &has, &Shallow::WHOLE).unwrap();
    transfer::derive_against(&src, &[tip], &has, &mut plan).unwrap();
    let paired: Vec<_> = plan.iter().filter(|p| p.against.is_some()).collect();
    assert_eq!(paired.len(), 1, "{plan:?}");
    let p = *paired[0];
    let base = p.against.unwrap();
    let record = transfer::derived_record(&src, &p.id, &base)
        .unwrap()
        .expect("a delta smaller than the stored record");
    assert!(
        (record.len() as u64) * 2 < p.size,
        "{} of {}",
        record.len(),
        p.size
    );
    // Kept for the next fetch of the same pair, which takes it as it is.
    assert!(transfer::is_kept(&p.id, &base));
    let again = transfer::derived_record(&src, &p.id, &base).unwrap();
    assert!(again.as_deref() == Some(&record[..]));
    let missing: std::collections::HashSet<ObjectId> =
        transfer::missing(&dst, &plan.iter().map(|p| p.id).collect::<Vec<_>>())
            .unwrap()
            .into_iter()
            .collect();
    assert!(missing.contains(&p.id));
    let send: Vec<ObjectId> = (plan.iter())
        .filter(|p| missing.contains(&p.id))
        .map(|p| p.id)
        .collect();
    let against = [(p.id, base)].into_iter().collect();
    let mut coded = Vec::new();
    transfer::write_pack_against(&src, &send, &against, None, &mut coded).unwrap();
    let mut whole = Vec::new();
    transfer::write_pack(&src, &send, &mut whole).unwrap();
    assert!(
        coded.len() * 2 < whole.len(),
        "{} against {}",
        coded.len(),
        whole.len()
    );
    // A delta against a tensor the receiver lacks is refused, and changes nothing.
    let fresh = Repository::init(&dir.path().join("fresh")).unwrap();
    assert!(transfer::receive_pack(&fresh, &mut &coded[..], u64::MAX).is_err());
    assert!(transfer::commits(&fresh).unwrap().is_empty());
    transfer::receive_pack(&dst, &mut &coded[..], u64::MAX).unwrap();
    let a = dir.path().join("a.safetensors");
    let b = dir.path().join("b.safetensors");
    let at = |repo: &Repository, out: &Path| {
        checkout(
            repo,
            &tip.to_string(),
            out,
            &CheckoutOptions::default(),
            &NoProgress,
        )
        .unwrap();
    };
    at(&src, &a);
    at(&dst, &b);
    assert_eq!(std::fs::read(&b).unwrap(), next);
    assert_eq!(std::fs::read(&a).unwrap(), next);
}

/// The commits of a plan, in its order.
fn planned_commits(
    plan: &[mdl::transfer::PlannedObject],
    all: &[ObjectId],
) -> Vec<(ObjectId, bool)> {
    plan.iter()
        .filter(|p| all.contains(&p.id))
        .map(|p| (p.id, p.cut))
        .collect()
}

/// Fetches `want` from `src` into `dst` as a client does: a plan for what `dst` holds, within
/// `limit`, and its pack received as planned.
fn fetch_into(
    src: &Repository,
    dst: &Repository,
    want: &[ObjectId],
    limit: &Shallow,
) -> mdl::Result<transfer::Receipt> {
    let have: std::collections::HashSet<ObjectId> =
        transfer::commits(dst).unwrap().into_iter().collect();
    let plan = transfer::plan(src, want, &|id| have.contains(id), limit)?;
    let ids: Vec<ObjectId> = plan.iter().map(|p| p.id).collect();
    let mut bytes = Vec::new();
    transfer::write_pack(src, &ids, &mut bytes)?;
    transfer::receive_expected(dst, &mut &bytes[..], transfer::Expect::Planned(&plan))
}

fn same_checkout(a: &Repository, b: &Repository, id: &ObjectId, dir: &Path) {
    let (x, y) = (dir.join("x"), dir.join("y"));
    let opts = CheckoutOptions {
        force: true,
        ..CheckoutOptions::default()
    };
    checkout(a, &id.to_hex(), &x, &opts, &NoProgress).unwrap();
    checkout(b, &id.to_hex(), &y, &opts, &NoProgress).unwrap();
    assert!(std::fs::read(x).unwrap() == std::fs::read(y).unwrap());
}

/// A shallow copy holds the newest commit alone, its history marked cut (log, fsck and
/// revisions say so); deepening brings two more; the marks survive an index rebuilt from the
/// records; a commit whose parents do not come is refused unless its plan marks it cut.
#[test]
fn a_shallow_copy_holds_the_newest_commits_and_deepens() {
    let dir = tempfile::tempdir().unwrap();
    let (src, ids) = trained_series(dir.path(), 5, &SERIES);
    let tip = ids[4];
    let dst_dir = dir.path().join("dst");
    let dst = Repository::init(&dst_dir).unwrap();
    let depth = |n| Shallow {
        depth: Some(n),
        since: None,
    };

    // A plan that sends the tip without its parents, not marked cut, is refused whole.
    let mut plan = transfer::plan(&src, &[tip], &|_| false, &depth(1)).unwrap();
    assert_eq!(planned_commits(&plan, &ids), [(tip, true)]);
    for p in &mut plan {
        p.cut = false;
    }
    let ids_planned: Vec<ObjectId> = plan.iter().map(|p| p.id).collect();
    let mut bytes = Vec::new();
    transfer::write_pack(&src, &ids_planned, &mut bytes).unwrap();
    let err = transfer::receive_expected(&dst, &mut &bytes[..], transfer::Expect::Planned(&plan))
        .unwrap_err();
    assert!(matches!(err, Error::Incomplete(_)), "{err}");
    assert_eq!(commits(&dst), 0);
    assert!(mdl::shallow::cut(&dst).unwrap().is_empty());

    // Depth 1: the tip alone, cut.
    fetch_into(&src, &dst, &[tip], &depth(1)).unwrap();
    set_ref(&dst, "refs/heads/main", None, tip, false).unwrap();
    assert_eq!(commits(&dst), 1);
    let cut: Vec<ObjectId> = mdl::shallow::cut(&dst).unwrap().into_iter().collect();
    assert_eq!(cut, [tip]);
    let log = mdl::log::log(&dst, Some("main"), None).unwrap();
    assert_eq!(log.len(), 1);
    assert!(log[0].cut);
    let report = mdl::fsck::fsck(&dst, false).unwrap();
    assert!(report.ok(), "{:?}", report.problems);
    assert_eq!(report.cut, 1);
    let err = mdl::revision::resolve(&dst, "main~1").unwrap_err();
    assert!(err.to_string().contains("history is cut"), "{err}");
    same_checkout(&src, &dst, &tip, dir.path());

    // Deepened by two: the tip's parent and grandparent come, the cut moves to the latter.
    let want = mdl::shallow::parents_beyond(&dst).unwrap();
    assert_eq!(want, [ids[3]]);
    fetch_into(&src, &dst, &want, &depth(2)).unwrap();
    let cut: Vec<ObjectId> = mdl::shallow::cut(&dst).unwrap().into_iter().collect();
    assert_eq!(cut, [ids[2]]);
    let log = mdl::log::log(&dst, Some("main"), None).unwrap();
    let shown: Vec<(ObjectId, bool)> = log.iter().map(|e| (e.id, e.cut)).collect();
    assert_eq!(shown, [(ids[4], false), (ids[3], false), (ids[2], true)]);
    assert!(mdl::fsck::fsck(&dst, false).unwrap().ok());
    same_checkout(&src, &dst, &ids[2], dir.path());

    // The index rebuilt from the records keeps the cut (it is journaled).
    drop(dst);
    std::fs::remove_file(dst_dir.join(".mdl/meta.redb")).unwrap();
    let (rebuilt, report) = mdl::fsck::repair(&dst_dir, &mdl::OpenOptions::default()).unwrap();
    assert!(rebuilt.is_some());
    assert!(report.ok(), "{:?}", report.problems);
    assert_eq!(report.cut, 1);
    let dst = Repository::open(&dst_dir, &mdl::OpenOptions::default()).unwrap();
    let cut: Vec<ObjectId> = mdl::shallow::cut(&dst).unwrap().into_iter().collect();
    assert_eq!(cut, [ids[2]]);

    // `since`: that commit and what came after, it cut; a deeper plan for a holder of the
    // newest commits sends only the older ones.
    let since = Shallow {
        depth: None,
        since: Some(ids[1]),
    };
    let plan = transfer::plan(&src, &[tip], &|_| false, &since).unwrap();
    let expect: Vec<(ObjectId, bool)> = (1..5).map(|i| (ids[i], i == 1)).collect();
    assert_eq!(planned_commits(&plan, &ids), expect);
    let whole = transfer::plan(
        &src,
        &[ids[1]],
        &|id| *id != ids[0] && *id != ids[1],
        &Shallow::WHOLE,
    )
    .unwrap();
    assert_eq!(
        planned_commits(&whole, &ids),
        [(ids[0], false), (ids[1], false)]
    );
}
