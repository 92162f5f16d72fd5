//! Warm repeated commits: a committer keeps its last commit's tensors, and the next commit
//! takes its deltas against them without reading the parent's records, storing exactly what a
//! cold commit stores.

#![allow(clippy::disallowed_methods)]

use std::path::Path;

use mdl::background::Committer;
use mdl::commit::{CommitOptions, CommitOutcome, MemoryFile, Staged};
use mdl::{NoProgress, OpenOptions, Repository};

mod common;
use common::{safetensors_bytes, stored_layout as layout, Record};

/// A weight matrix that drifts a little each step (reverse deltas pay), and an unchanged one.
fn state(step: u64) -> Vec<MemoryFile> {
    vec![MemoryFile::new("model.safetensors", state_bytes(step))]
}

/// The bytes of [`state`]'s one file.
fn state_bytes(step: u64) -> Vec<u8> {
    let w: Vec<u8> = (0..200_000u32)
        .flat_map(|i| {
            let x = ((i as f32) * 0.37).sin() * 0.02 + step as f32 * 1e-7 * ((i % 7) as f32);
            x.to_le_bytes()
        })
        .collect();
    let b: Vec<u8> = (0..50_000u32)
        .flat_map(|i| ((i as f32) * 0.11).cos().to_le_bytes())
        .collect();
    safetensors_bytes(&[
        ("w", "F32", vec![400, 500], w),
        ("b", "F32", vec![50_000], b),
    ])
}

fn opts(step: u64, lossy: bool) -> CommitOptions {
    let mut o = CommitOptions {
        step: Some(step),
        message: format!("step {step}"),
        metrics: vec![("loss".into(), 2.0)],
        ..Default::default()
    };
    if lossy {
        o.lossy.mode = Some(mdl::lossy::CodecMode::Lossy);
    }
    o
}

/// A committer into the repository at `root` keeping `warm_bytes` of its last commit.
fn keeping(root: &Path, warm_bytes: u64) -> Committer {
    let at = root.to_path_buf();
    Committer::keeping(
        move || Repository::open(&at, &OpenOptions::default()),
        warm_bytes,
    )
}

/// Step `s`'s options with forward deltas (an RL trainer's).
fn forward(s: u64) -> CommitOptions {
    CommitOptions {
        delta: Some(mdl::policy::DeltaPolicy {
            mode: mdl::policy::DeltaMode::Forward,
            ..Default::default()
        }),
        ..opts(s, false)
    }
}

fn series(root: &Path, warm_bytes: u64, lossy: bool, steps: u64) -> Vec<CommitOutcome> {
    Repository::init(root).unwrap();
    series_in(root, warm_bytes, lossy, steps)
}

/// [`series`] in a repository that exists.
fn series_in(root: &Path, warm_bytes: u64, lossy: bool, steps: u64) -> Vec<CommitOutcome> {
    let committer = keeping(root, warm_bytes);
    (1..=steps)
        .map(|s| {
            committer
                .submit(Staged::memory(state(s), &[]).unwrap(), opts(s, lossy))
                .unwrap()
                .wait()
                .unwrap()
        })
        .collect()
}

#[test]
fn warm_commits_store_what_cold_ones_do() {
    for lossy in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (cold, warm) = (dir.path().join("cold"), dir.path().join("warm"));
        let a = series(&cold, 0, lossy, 4);
        let b = series(&warm, 1 << 30, lossy, 4);
        assert_eq!(layout(&cold, &a), layout(&warm, &b), "lossy: {lossy}");
        // Deltas (lossless) and residuals (lossy) are taken against the previous version.
        let against_previous = layout(&warm, &b)
            .iter()
            .flat_map(|(_, t)| t.clone())
            .any(|(_, c, _)| c.ends_with("-delta") || c == "quant-residual");
        assert!(against_previous, "lossy: {lossy}");
    }
}

/// The first-generation record file of object `id` (docs/FORMAT.md).
fn record_path(root: &Path, id: &mdl::ObjectId) -> std::path::PathBuf {
    let hex = id.to_hex();
    root.join(".mdl/objects")
        .join(&hex[..2])
        .join(format!("{}.0", &hex[2..]))
}

#[test]
fn a_warm_commit_does_not_read_its_parents_records() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    Repository::init(&root).unwrap();
    let committer = keeping(&root, 1 << 30);
    // Eager reverse deltas: the commit takes them against the warm tensors itself (a deferring
    // committer's re-encodes are `a_committer_works_its_deferred_reencodes`').
    let eager = |s| CommitOptions {
        delta: Some(mdl::policy::DeltaPolicy {
            defer: false,
            ..Default::default()
        }),
        ..opts(s, false)
    };
    let submit = |s| {
        committer
            .submit(Staged::memory(state(s), &[]).unwrap(), eager(s))
            .unwrap()
            .wait()
            .unwrap()
    };
    submit(1);
    // The first commit's tensor records disappear (as if unreadable): a commit that read them
    // would fail.
    let repo = Repository::open(&root, &OpenOptions::default()).unwrap();
    let shown = mdl::show::show(&repo, "main").unwrap();
    let w = shown.tensors.iter().find(|t| t.name == "w").unwrap();
    let id = w.id;
    let record = record_path(&root, &id);
    let original = std::fs::read(&record).unwrap();
    std::fs::remove_file(&record).unwrap();
    drop(repo);
    submit(2);
    // The first commit's weight is now a delta against the second's, written from memory: it
    // checks out byte for byte.
    let repo = Repository::open(&root, &OpenOptions::default()).unwrap();
    let shown = mdl::show::show(&repo, "main~1").unwrap();
    let w = shown.tensors.iter().find(|t| t.name == "w").unwrap();
    assert!(w.codec.ends_with("-delta"), "{}", w.codec);
    let out = dir.path().join("out");
    mdl::checkout::checkout(&repo, "main~1", &out, &Default::default(), &NoProgress).unwrap();
    let expected = state_bytes(1);
    let out = if out.is_dir() {
        out.join("model.safetensors")
    } else {
        out
    };
    assert_eq!(std::fs::read(out).unwrap(), expected);
    assert!(!original.is_empty());
    // A cold committer cannot do the same: it reads the parent's records.
    let cold = keeping(&root, 0);
    let shown = mdl::show::show(&repo, "main").unwrap();
    let w = shown.tensors.iter().find(|t| t.name == "w").unwrap();
    let id = w.id;
    std::fs::remove_file(record_path(&root, &id)).unwrap();
    drop(repo);
    let failed = cold
        .submit(Staged::memory(state(3), &[]).unwrap(), eager(3))
        .unwrap()
        .wait();
    assert!(failed.is_err());
}

/// A committer into a repository that defers its reverse deltas (`delta.defer`) does the
/// re-encodes itself after each commit, with the commit's tensors warm: once it is done, the
/// repository holds what eager commits store.
#[test]
fn a_committer_works_its_deferred_reencodes() {
    let dir = tempfile::tempdir().unwrap();
    let (eager, deferred) = (dir.path().join("eager"), dir.path().join("deferred"));
    for (root, defer) in [(&eager, "false"), (&deferred, "true")] {
        let repo = Repository::init(root).unwrap();
        mdl::config::set_config(&repo, "delta.defer", defer).unwrap();
    }
    let a = series_in(&eager, 1 << 30, false, 4);
    // The committer is dropped at the end of the series: that waits for its work.
    let b = series_in(&deferred, 1 << 30, false, 4);
    let tensors = |root: &Path, o: &[CommitOutcome]| -> Vec<Vec<Record>> {
        layout(root, o).into_iter().map(|(_, t)| t).collect()
    };
    assert_eq!(tensors(&eager, &a), tensors(&deferred, &b));
    assert!(tensors(&deferred, &b)
        .iter()
        .flatten()
        .any(|(_, c, _)| c.ends_with("-delta")));
    let repo = Repository::open(&deferred, &OpenOptions::default()).unwrap();
    assert_eq!(mdl::commit::pending_deferred(&repo).unwrap(), 0);
}

/// An RL-like step in bf16: about one element in a hundred of `w` moves a unit in the last
/// place each step; `tied` (the same bytes under two names) changes at step 3; `fixed` never.
fn rl_state(step: u64) -> Vec<MemoryFile> {
    vec![MemoryFile::new("model.safetensors", rl_state_bytes(step))]
}

/// The bytes of [`rl_state`]'s one file.
fn rl_state_bytes(step: u64) -> Vec<u8> {
    let bf16 = |x: u16| x.to_le_bytes();
    let w: Vec<u8> = (0..300_000u32)
        .flat_map(|i| {
            let moved = (1..=step)
                .filter(|s| (i as u64 * 7 + s * 13).is_multiple_of(97))
                .count() as u16;
            bf16(0x3c00 + (i % 500) as u16 + moved)
        })
        .collect();
    let tied: Vec<u8> = (0..20_000u32)
        .flat_map(|i| bf16(0x3f00 + (i % 64) as u16 + u16::from(step >= 3)))
        .collect();
    let fixed: Vec<u8> = (0..20_000u32).flat_map(|i| bf16(i as u16)).collect();
    safetensors_bytes(&[
        ("w", "BF16", vec![300_000], w),
        ("tied_a", "BF16", vec![20_000], tied.clone()),
        ("tied_b", "BF16", vec![20_000], tied),
        ("fixed", "BF16", vec![20_000], fixed),
    ])
}

/// A committer of forward-delta steps writes each changed tensor into the buffer its previous
/// version leaves and carries unchanged ones over: every step still takes its deltas against
/// the warm tensors alone (the parent's records gone), stores what a cold series stores, and
/// checks out byte for byte — tied and unchanged tensors included.
#[test]
fn warm_forward_steps_reuse_their_buffers_and_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    let run = |root: &Path, warm_bytes: u64, drop_parents: bool| -> Vec<CommitOutcome> {
        Repository::init(root).unwrap();
        let committer = keeping(root, warm_bytes);
        (1..=6)
            .map(|s| {
                if drop_parents && s > 1 {
                    set_aside_parents(root);
                }
                let outcome = committer
                    .submit(Staged::memory(rl_state(s), &[]).unwrap(), forward(s))
                    .unwrap()
                    .wait()
                    .unwrap();
                if drop_parents {
                    restore_records(root);
                }
                outcome
            })
            .collect()
    };
    let (cold, warm) = (dir.path().join("cold"), dir.path().join("warm"));
    let a = run(&cold, 0, false);
    let b = run(&warm, 1 << 30, true);
    assert_eq!(layout(&cold, &a), layout(&warm, &b));
    let repo = Repository::open(&warm, &OpenOptions::default()).unwrap();
    let shown = mdl::show::show(&repo, "main").unwrap();
    let w = shown.tensors.iter().find(|t| t.name == "w").unwrap();
    assert!(w.codec.ends_with("-delta"), "{}", w.codec);
    for s in 1..=6u64 {
        let out = dir.path().join(format!("out{s}"));
        let rev = format!("main~{}", 6 - s);
        mdl::checkout::checkout(&repo, &rev, &out, &Default::default(), &NoProgress).unwrap();
        let file = match out.is_dir() {
            true => out.join("model.safetensors"),
            false => out,
        };
        assert_eq!(std::fs::read(file).unwrap(), rl_state_bytes(s), "step {s}");
    }
}

/// Sets aside the record files of the tensors of `main`'s commit: only a warm set has them
/// then, until [`restore_records`].
fn set_aside_parents(root: &Path) {
    let repo = Repository::open(root, &OpenOptions::default()).unwrap();
    for t in &mdl::show::show(&repo, "main").unwrap().tensors {
        let path = record_path(root, &t.id);
        if path.exists() {
            std::fs::rename(&path, path.with_extension("aside")).unwrap();
        }
    }
}

/// Puts back the record files [`set_aside_parents`] set aside.
fn restore_records(root: &Path) {
    for dir in std::fs::read_dir(root.join(".mdl/objects")).unwrap() {
        let Ok(dir) = dir else { continue };
        let Ok(files) = std::fs::read_dir(dir.path()) else {
            continue;
        };
        for f in files.flatten() {
            let p = f.path();
            if p.extension().is_some_and(|e| e == "aside") {
                std::fs::rename(&p, p.with_extension("0")).unwrap();
            }
        }
    }
}

/// A bf16 tensor of 64 MiB (a size stored a window at a time) at `step`: one element in
/// ninety-seven a unit up at each step.
fn large_step_bytes(step: u64) -> Vec<u8> {
    let n = 32u64 << 20;
    let w: Vec<u8> = (0..n)
        .flat_map(|i| {
            let moved = (1..=step).filter(|s| (i + s * 31) % 97 == 0).count() as u16;
            (0x3c00 + (i % 700) as u16 + moved).to_le_bytes()
        })
        .collect();
    safetensors_bytes(&[("big", "BF16", vec![n], w)])
}

/// A committer of forward steps keeps large tensors too (where they lie in memory), and the
/// next step of one is a masked delta taken against the kept version — even with the parent's
/// records gone — that checks out byte for byte; an unchanged step stores nothing.
#[test]
fn a_large_tensor_s_steps_are_masked_deltas_against_the_warm_set() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    Repository::init(&root).unwrap();
    let committer = keeping(&root, 1 << 30);
    let states = [1, 2, 2, 3].map(large_step_bytes);
    let mut ids = Vec::new();
    for (k, bytes) in states.iter().enumerate() {
        if k > 0 {
            set_aside_parents(&root);
        }
        let file = MemoryFile::new("model.safetensors", bytes.clone());
        let s = k as u64 + 1;
        let outcome = committer
            .submit(Staged::memory(vec![file], &[]).unwrap(), forward(s))
            .unwrap()
            .wait()
            .unwrap();
        restore_records(&root);
        ids.push(outcome.id);
    }
    let repo = Repository::open(&root, &OpenOptions::default()).unwrap();
    let shown =
        |id: &mdl::ObjectId| mdl::show::show(&repo, &id.to_hex()).unwrap().tensors[0].clone();
    for k in [1, 3] {
        let t = shown(&ids[k]);
        let record = std::fs::read(record_path(&root, &t.id)).unwrap();
        let (_, len) = mdl_format::record::RecordHeader::decode(&record).unwrap();
        assert!(t.codec.ends_with("-delta"), "step {k}: {}", t.codec);
        assert!(matches!(record[len], 1 | 9), "step {k}: a masked payload");
        // About one element in 97 changed: far under a fiftieth of the 64 MiB.
        assert!(
            t.stored_bytes * 50 < 64 << 20,
            "step {k}: {} stored bytes",
            t.stored_bytes
        );
    }
    // The unchanged step names the same object.
    assert_eq!(shown(&ids[2]).id, shown(&ids[1]).id);
    for (k, bytes) in states.iter().enumerate() {
        let out = dir.path().join(format!("out{k}"));
        mdl::checkout::checkout(
            &repo,
            &ids[k].to_hex(),
            &out,
            &Default::default(),
            &NoProgress,
        )
        .unwrap();
        let file = match out.is_dir() {
            true => out.join("model.safetensors"),
            false => out,
        };
        assert!(std::fs::read(file).unwrap() == *bytes, "step {}", k + 1);
    }
}
