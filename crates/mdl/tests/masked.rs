//! Masked deltas (format 11) through the library, on RL-like steps: 1 % of a bf16 tensor's
//! elements move by a unit in the last place a step. The previous version (reverse deltas), the
//! new one (forward deltas) and the record a fetch derives are masked payloads, smaller than a
//! third of index+value patches; every commit checks out byte for byte (the tensor spans
//! several read windows); a damaged masked record is refused with nothing written.

#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};

use mdl::checkout::{checkout, CheckoutOptions};
use mdl::commit::{commit, CommitOptions};
use mdl::policy::{DeltaMode, DeltaPolicy};
use mdl::transfer::{self, Shallow};
use mdl::{NoProgress, ObjectId, Repository};
use mdl_format::record::RecordHeader;

mod common;
use common::{checks_out_exactly, write_safetensors, Rng};

/// Elements of the bf16 tensor: more than one read window (2 Mi elements).
const N: usize = (5 << 20) / 2;

/// An RL-like run: bf16 weights, a hundredth of them a unit in the last place up or down each
/// step, and an f32 norm whose every hundredth element moves too.
struct Run {
    rng: Rng,
    w: Vec<u16>,
    norm: Vec<f32>,
}

impl Run {
    fn new() -> Run {
        let mut rng = Rng(72);
        let w = (0..N)
            .map(|_| ((rng.normal() as f32 * 0.02).to_bits() >> 16) as u16)
            .collect();
        let norm = (0..65_536).map(|i| 1.0 + i as f32 * 1e-6).collect();
        Run { rng, w, norm }
    }

    /// One step; the number of bf16 elements it changed.
    fn step(&mut self) -> usize {
        let mut changed = 0;
        for w in &mut self.w {
            if self.rng.uniform() < 0.01 {
                *w = if self.rng.next().is_multiple_of(2) {
                    w.wrapping_add(1)
                } else {
                    w.wrapping_sub(1)
                };
                changed += 1;
            }
        }
        for x in self.norm.iter_mut().step_by(100) {
            *x += 1e-4;
        }
        changed
    }

    fn write(&self, path: &Path) {
        let w: Vec<u8> = self.w.iter().flat_map(|x| x.to_le_bytes()).collect();
        let norm: Vec<u8> = self.norm.iter().flat_map(|x| x.to_le_bytes()).collect();
        write_safetensors(
            path,
            &[
                ("model.w", "BF16", vec![N as u64], w),
                ("model.norm", "F32", vec![self.norm.len() as u64], norm),
            ],
        );
    }
}

/// Commits `steps + 1` versions under `mode`: their files, commit ids, and the bf16 elements
/// each step changed.
fn run(dir: &Path, steps: usize, mode: DeltaMode) -> (Repository, Vec<(PathBuf, ObjectId)>, usize) {
    let repo = Repository::init(&dir.join("repo")).unwrap();
    let mut r = Run::new();
    let mut out = Vec::new();
    let mut changed = 0;
    for i in 0..=steps {
        if i > 0 {
            changed = changed.max(r.step());
        }
        let path = dir.join(format!("step{i}.safetensors"));
        r.write(&path);
        let opts = CommitOptions {
            delta: Some(DeltaPolicy {
                mode,
                max_depth: 3,
                max_restore_cost: None,
                defer: false,
            }),
            ..CommitOptions::default()
        };
        out.push((
            path.clone(),
            commit(&repo, &path, &opts, &NoProgress).unwrap().id,
        ));
    }
    (repo, out, changed)
}

/// `model.w` of a commit as stored: its id, codec, stored bytes and depth.
fn stored_w(repo: &Repository, commit: &ObjectId) -> (ObjectId, String, u64, u32) {
    let shown = mdl::show::show(repo, &commit.to_hex()).unwrap();
    let t = shown.tensors.iter().find(|t| t.name == "model.w").unwrap();
    (t.id, t.codec.clone(), t.stored_bytes, t.depth)
}

/// Whether a record's payload is masked (its first byte 1, or 9 for a run-coded mask, in a
/// delta record).
fn is_masked(record: &[u8]) -> bool {
    let (header, len) = RecordHeader::decode(record).unwrap();
    [3, 7].contains(&header.codec) && matches!(record[len], 1 | 9)
}

/// TRL's index+value patches of a step: an int32 index and a bf16 value a changed element.
fn patches(changed: usize) -> u64 {
    changed as u64 * 6
}

#[test]
fn reverse_deltas_of_rl_steps_are_masked_and_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, commits, changed) = run(dir.path(), 2, DeltaMode::Reverse);
    for (i, (_, c)) in commits.iter().enumerate() {
        let (id, codec, bytes, depth) = stored_w(&repo, c);
        if i + 1 == commits.len() {
            assert_eq!(depth, 0, "the newest version is whole");
            continue;
        }
        // Each version a delta of the next.
        let behind = (commits.len() - 1 - i) as u32;
        assert!(
            codec.ends_with("-delta") && depth == behind,
            "{codec} at {depth}"
        );
        let record = std::fs::read(mdl::inspect::record_path(&repo, &id).unwrap()).unwrap();
        assert!(is_masked(&record), "commit {i}: {codec} not masked");
        assert!(
            bytes * 3 <= patches(changed),
            "commit {i}: {bytes} bytes against {} of patches",
            patches(changed)
        );
    }
    checks_out_exactly(&repo, &commits, dir.path());
}

#[test]
fn forward_deltas_of_rl_steps_are_masked_along_a_capped_chain() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, commits, changed) = run(dir.path(), 5, DeltaMode::Forward);
    let mut masked = 0;
    for (_, c) in &commits {
        let (id, _, bytes, depth) = stored_w(&repo, c);
        assert!(depth <= 3);
        let record = std::fs::read(mdl::inspect::record_path(&repo, &id).unwrap()).unwrap();
        if depth > 0 {
            assert!(is_masked(&record));
            assert!(
                bytes * 3 <= patches(changed),
                "{bytes} against {}",
                patches(changed)
            );
            masked += 1;
        }
    }
    // Six versions under a cap of 3: an anchor, three deltas, an anchor, a delta.
    assert_eq!(masked, 4);
    checks_out_exactly(&repo, &commits, dir.path());
}

#[test]
fn a_fetch_of_an_rl_step_moves_a_masked_delta() {
    let dir = tempfile::tempdir().unwrap();
    let (src, commits, changed) = run(dir.path(), 1, DeltaMode::Reverse);
    let (old, new) = (commits[0].1, commits[1].1);
    // The receiver holds the first step.
    let dst = Repository::init(&dir.path().join("dst")).unwrap();
    let has_none = |_: &ObjectId| false;
    let plan = transfer::plan(&src, &[old], &has_none, &Shallow::WHOLE).unwrap();
    let mut first = Vec::new();
    transfer::write_pack(
        &src,
        &plan.iter().map(|p| p.id).collect::<Vec<_>>(),
        &mut first,
    )
    .unwrap();
    transfer::receive_pack(&dst, &mut &first[..], u64::MAX).unwrap();

    let has = |id: &ObjectId| *id == old;
    let mut plan = transfer::plan(&src, &[new], &has, &Shallow::WHOLE).unwrap();
    transfer::derive_against(&src, &[new], &has, &mut plan).unwrap();
    let (w_new, ..) = stored_w(&src, &new);
    let p = plan.iter().find(|p| p.id == w_new).unwrap();
    let base = p.against.expect("a delta against the held version");
    let record = transfer::derived_record(&src, &p.id, &base)
        .unwrap()
        .unwrap();
    assert!(is_masked(&record));
    // The old version's stored reverse delta, turned round: no tensor decoded to make it.
    let (w_old, ..) = stored_w(&src, &old);
    let stored = std::fs::read(mdl::inspect::record_path(&src, &w_old).unwrap()).unwrap();
    let (head, payload, _) = mdl_format::record::decode(&stored).unwrap();
    let (_, sent, _) = mdl_format::record::decode(&record).unwrap();
    let spec = match head.codec {
        3 => mdl_codec::planes::PlaneSpec::planes(mdl_format::Dtype::BF16, 0),
        _ => mdl_codec::planes::PlaneSpec::sub(mdl_format::Dtype::BF16),
    };
    let turned = mdl_codec::float::invert_masked(spec, (N * 2) as u64, payload).unwrap();
    assert!(
        sent == turned.as_slice(),
        "not the stored delta turned round"
    );
    assert!(
        record.len() as u64 * 3 <= patches(changed),
        "{} bytes against {} of patches",
        record.len(),
        patches(changed)
    );
    let send: Vec<ObjectId> =
        transfer::missing(&dst, &plan.iter().map(|p| p.id).collect::<Vec<_>>()).unwrap();
    let against = [(p.id, base)].into_iter().collect();
    let mut coded = Vec::new();
    transfer::write_pack_against(&src, &send, &against, None, &mut coded).unwrap();
    transfer::receive_pack(&dst, &mut &coded[..], u64::MAX).unwrap();
    checks_out_exactly(&dst, &commits, dir.path());
}

#[test]
fn a_damaged_masked_record_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, commits, _) = run(dir.path(), 1, DeltaMode::Reverse);
    let (id, ..) = stored_w(&repo, &commits[0].1);
    let path = mdl::inspect::record_path(&repo, &id).unwrap();
    let good = std::fs::read(&path).unwrap();
    let (_, len) = RecordHeader::decode(&good).unwrap();
    // A byte of the mask, then a byte of the values: each refused by the record's checksum;
    // re-made with a valid checksum, by the content hash.
    for at in [len + 12, (len + good.len()) / 2] {
        for fix_crc in [false, true] {
            let mut bad = good.clone();
            bad[at] ^= 0x24;
            if fix_crc {
                let n = bad.len();
                let crc = crc32fast::hash(&bad[..n - 4]);
                bad[n - 4..].copy_from_slice(&crc.to_le_bytes());
            }
            std::fs::write(&path, &bad).unwrap();
            let out = dir.path().join("out.safetensors");
            let err = checkout(
                &repo,
                &commits[0].1.to_hex(),
                &out,
                &CheckoutOptions::default(),
                &NoProgress,
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains(&id.to_hex()[..12]), "{err}");
            assert!(!out.exists(), "nothing written");
        }
    }
    std::fs::write(&path, &good).unwrap();
    checks_out_exactly(&repo, &commits, dir.path());
}

/// A tensor to patch: the newer version's place, the id of the version `bytes` hold, and them.
fn target<'a>(
    placed: &'a mdl::checkout::Placed,
    id: ObjectId,
    bytes: &'a mut [u8],
) -> mdl::checkout::patch::Target<'a> {
    mdl::checkout::patch::Target { placed, id, bytes }
}

#[test]
fn a_step_is_patched_into_the_bytes_held_and_wrong_bytes_are_restored() {
    use mdl::checkout::patch::{patch_in_place, patchable};
    let dir = tempfile::tempdir().unwrap();
    let (repo, commits, _) = run(dir.path(), 2, DeltaMode::Forward);
    let placed = |c: &ObjectId, name: &str| {
        let layout = mdl::checkout::layout(&repo, &c.to_hex()).unwrap();
        layout.single().unwrap().tensor(name).unwrap().clone()
    };
    let (w, norm) = (
        placed(&commits[1].1, "model.w"),
        placed(&commits[1].1, "model.norm"),
    );
    let (w2, norm2) = (
        placed(&commits[2].1, "model.w"),
        placed(&commits[2].1, "model.norm"),
    );
    let (held_w, held_norm) = (w.load(&repo).unwrap(), norm.load(&repo).unwrap());
    let (want_w, want_norm) = (w2.load(&repo).unwrap(), norm2.load(&repo).unwrap());

    let (mut live_w, mut live_norm) = (held_w.clone(), held_norm.clone());
    let mut targets = [
        target(&w2, w.id, &mut live_w),
        target(&norm2, norm.id, &mut live_norm),
    ];
    assert!(patch_in_place(&repo, &mut targets).unwrap());
    assert!(
        live_w == want_w && live_norm == want_norm,
        "patched bytes differ"
    );

    // One tensor's bytes not the version their id names: refused, and both tensors restored
    // (the one that checked out too), byte for byte.
    let (mut live_w, mut live_norm) = (held_w.clone(), held_norm.clone());
    live_norm[held_norm.len() / 3] ^= 1;
    let wrong_norm = live_norm.clone();
    let mut targets = [
        target(&w2, w.id, &mut live_w),
        target(&norm2, norm.id, &mut live_norm),
    ];
    let err = patch_in_place(&repo, &mut targets).unwrap_err();
    assert!(err.to_string().contains(&norm2.id.to_hex()[..12]), "{err}");
    assert!(live_w == held_w && live_norm == wrong_norm, "not restored");

    // A version stored whole, or a delta over another version: not patchable, and where one
    // is among the targets nothing is written.
    let first = placed(&commits[0].1, "model.w");
    let can = patchable(&repo, &[(&w2, w.id), (&first, w.id), (&w2, first.id)]).unwrap();
    assert_eq!(can, [true, false, false]);
    let (mut live_w, mut live) = (held_w.clone(), held_w.clone());
    let mut targets = [
        target(&w2, w.id, &mut live_w),
        target(&first, w.id, &mut live),
    ];
    assert!(!patch_in_place(&repo, &mut targets).unwrap());
    assert!(live_w == held_w && live == held_w, "nothing written");
}
