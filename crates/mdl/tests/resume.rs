//! A fetch cut off inside a record goes on from where it stopped: the receiver keeps the
//! record's start, the sender sends the rest only if its record starts with those bytes, and
//! the record joined from both is checked like any other; a sender that goes on with a record
//! it was not asked to is refused, and nothing of its pack stays.

#![allow(clippy::disallowed_methods)]

use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use mdl::commit::{commit, CommitOptions};
use mdl::transfer::{self, Partial, PlannedObject, Shallow};
use mdl::{Error, NoProgress, ObjectId, Progress, Repository};

mod common;
use common::{write_safetensors, Rng};

/// A repository holding one commit of a 16 MiB f32 tensor of noise (its record some 12 MB):
/// the repository and the commit.
fn large(dir: &Path) -> (Repository, ObjectId) {
    let repo = Repository::init(&dir.join("src")).unwrap();
    let mut rng = Rng(11);
    let bytes: Vec<u8> = (0..4 << 20)
        .flat_map(|_| ((rng.normal() * 0.02) as f32).to_le_bytes())
        .collect();
    let f = dir.join("large.safetensors");
    write_safetensors(&f, &[("w", "F32", vec![4 << 20], bytes)]);
    let id = commit(&repo, &f, &CommitOptions::default(), &NoProgress)
        .unwrap()
        .id;
    (repo, id)
}

/// What a fetch of `tip` from `src` into an empty repository plans, and the pack of it, the
/// record `resume` names sent from where it says.
fn planned_pack(
    src: &Repository,
    tip: ObjectId,
    resume: Option<&mdl_protocol::body::Resume>,
) -> (Vec<PlannedObject>, Vec<u8>) {
    let plan = transfer::plan(src, &[tip], &|_| false, &Shallow::WHOLE).unwrap();
    let ids: Vec<ObjectId> = plan.iter().map(|p| p.id).collect();
    let mut pack = Vec::new();
    transfer::write_pack_against(src, &ids, &Default::default(), resume, &mut pack).unwrap();
    (plan, pack)
}

/// The tensor's planned record: its id and length.
fn tensor_record(plan: &[PlannedObject]) -> (ObjectId, u64) {
    let p = plan.iter().max_by_key(|p| p.size).unwrap();
    (p.id, p.size)
}

/// Counts what a progress total was lessened by.
#[derive(Default)]
struct Lessened(AtomicU64);

impl Progress for Lessened {
    fn start(&self, _: &str, _: u64) {}
    fn advance(&self, _: u64) {}
    fn lessen(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    fn finish(&self) {}
}

/// Objects the repository holds.
fn objects(repo: &Repository) -> u64 {
    let report = mdl::fsck::fsck(repo, false).unwrap();
    assert!(report.ok(), "{:?}", report.problems);
    report.objects_checked
}

#[test]
fn a_fetch_cut_inside_a_record_goes_on_from_there() {
    let dir = tempfile::tempdir().unwrap();
    let (src, tip) = large(dir.path());
    let dst = Repository::init(&dir.path().join("dst")).unwrap();
    let (plan, pack) = planned_pack(&src, tip, None);
    let (id, len) = tensor_record(&plan);

    // Cut at 60 %: inside the tensor's record (the first frame: bases first).
    let cut = pack.len() * 6 / 10;
    let err =
        transfer::receive_planned(&dst, &mut &pack[..cut], &plan, None, &NoProgress).unwrap_err();
    assert!(matches!(err, Error::TransferCut { .. }), "{err}");
    let kept = Partial::find(&dst)
        .unwrap()
        .expect("the record's start was kept");
    assert_eq!((kept.id, kept.len), (id, len));
    assert!(
        kept.held + (1 << 20) >= cut as u64 - 48,
        "{} of {cut}",
        kept.held
    );
    assert_eq!(objects(&dst), 0);

    // The sender goes on from there: fewer bytes move, the record is whole and checked.
    let asked = kept.resume().unwrap();
    let (_, rest) = planned_pack(&src, tip, Some(&asked));
    assert_eq!(rest.len() as u64, pack.len() as u64 - kept.held + 16);
    let lessened = Lessened::default();
    let got =
        transfer::receive_planned(&dst, &mut &rest[..], &plan, Some(&kept), &lessened).unwrap();
    assert_eq!(lessened.0.load(Ordering::Relaxed), kept.held);
    let moved: u64 = plan.iter().map(|p| p.size).sum::<u64>() - kept.held;
    assert_eq!(got.received.bytes, moved);
    assert!(
        Partial::find(&dst).unwrap().is_none(),
        "the start outlived its record"
    );
    // fsck decodes every object and hashes it against its id.
    assert_eq!(objects(&dst), plan.len() as u64);
    assert!(dst.has_object(&id).unwrap());
}

/// A fetch of a large commit into an empty repository, cut at half.
struct CutFetch {
    _dir: tempfile::TempDir,
    src: Repository,
    tip: ObjectId,
    dst: Repository,
    plan: Vec<PlannedObject>,
    /// The whole pack.
    pack: Vec<u8>,
    /// The record start it kept.
    kept: Partial,
}

impl CutFetch {
    fn new() -> CutFetch {
        let dir = tempfile::tempdir().unwrap();
        let (src, tip) = large(dir.path());
        let dst = Repository::init(&dir.path().join("dst")).unwrap();
        let (plan, pack) = planned_pack(&src, tip, None);
        let kept = keep_start(&dst, &plan, &pack);
        CutFetch {
            _dir: dir,
            src,
            tip,
            dst,
            plan,
            pack,
            kept,
        }
    }

    /// The pack the sender writes when asked to go on as `asked` says.
    fn resumed_pack(&self, asked: &mdl_protocol::body::Resume) -> Vec<u8> {
        planned_pack(&self.src, self.tip, Some(asked)).1
    }

    /// The file holding the kept start.
    fn kept_file(&self) -> std::path::PathBuf {
        std::fs::read_dir(self.dst.root().join(".mdl/partial"))
            .unwrap()
            .flatten()
            .next()
            .unwrap()
            .path()
    }
}

/// Receives `pack` of `plan` into `dst` cut at half: the start kept.
fn keep_start(dst: &Repository, plan: &[PlannedObject], pack: &[u8]) -> Partial {
    transfer::receive_planned(dst, &mut &pack[..pack.len() / 2], plan, None, &NoProgress)
        .unwrap_err();
    Partial::find(dst).unwrap().unwrap()
}

#[test]
fn a_record_start_that_differs_is_sent_whole() {
    let cut = CutFetch::new();
    let mut asked = cut.kept.resume().unwrap();
    asked.digest = ObjectId::hash(b"other bytes");
    assert_eq!(
        cut.resumed_pack(&asked),
        cut.pack,
        "a start that differs was gone on from"
    );
}

#[test]
fn a_record_gone_on_from_unasked_or_elsewhere_is_refused_and_nothing_stays() {
    let cut = CutFetch::new();
    let (dst, plan) = (&cut.dst, &cut.plan);
    let rest = cut.resumed_pack(&cut.kept.resume().unwrap());

    // Not asked for: the receiver holds no start.
    let err = transfer::receive_planned(dst, &mut &rest[..], plan, None, &NoProgress).unwrap_err();
    assert!(matches!(err, Error::BadTransfer(_)), "{err}");
    assert!(err.to_string().contains("not asked for"), "{err}");
    assert_eq!(objects(dst), 0);

    // From another offset than the start held: refused, and the start is dropped.
    // The frame's offset field follows the pack's magic and the frame's head.
    let mut elsewhere = rest.clone();
    let off = 8 + 40;
    let held = u64::from_le_bytes(elsewhere[off..off + 8].try_into().unwrap());
    elsewhere[off..off + 8].copy_from_slice(&(held - 1).to_le_bytes());
    let err =
        transfer::receive_planned(dst, &mut &elsewhere[..], plan, Some(&cut.kept), &NoProgress)
            .unwrap_err();
    assert!(err.to_string().contains("not asked for"), "{err}");
    assert_eq!(objects(dst), 0);
    assert!(Partial::find(dst).unwrap().is_none());

    // A start damaged here fails the record's checksum: refused, the start dropped.
    let kept = keep_start(dst, plan, &cut.pack);
    let path = cut.kept_file();
    let mut bytes = Vec::new();
    std::fs::File::open(&path)
        .unwrap()
        .read_to_end(&mut bytes)
        .unwrap();
    let asked = kept.resume().unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let rest = cut.resumed_pack(&asked);
    let err =
        transfer::receive_planned(dst, &mut &rest[..], plan, Some(&kept), &NoProgress).unwrap_err();
    assert!(matches!(err, Error::BadTransfer(_)), "{err}");
    assert_eq!(objects(dst), 0);
    assert!(Partial::find(dst).unwrap().is_none());
}

#[test]
fn gc_removes_a_record_start_left_for_an_hour_and_keeps_a_fresh_one() {
    let cut = CutFetch::new();
    let path = cut.kept_file();
    let opts = mdl::gc::GcOptions {
        prune_older_than: std::time::Duration::ZERO,
        ..Default::default()
    };
    mdl::gc::gc(&cut.dst, &opts, &NoProgress).unwrap();
    assert!(
        path.exists(),
        "gc removed a record start a fetch may go on from"
    );
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3660);
    std::fs::File::open(&path)
        .unwrap()
        .set_modified(old)
        .unwrap();
    mdl::gc::gc(&cut.dst, &opts, &NoProgress).unwrap();
    assert!(!path.exists(), "gc left a record start an hour old");
    assert!(Partial::find(&cut.dst).unwrap().is_none());
}
