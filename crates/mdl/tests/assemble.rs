//! One commit assembled from the trees of others (what the ranks of a sharded save publish):
//! it checks out byte for byte as the union of the parts, keeps their moment pairs, sums their
//! statistics, and a refused assembly leaves the branch where it was.

#![allow(clippy::disallowed_methods)]

use mdl::assemble::assemble;
use mdl::checkout::{checkout, CheckoutOptions};
use mdl::commit::{commit_memory, CommitOptions, KnownPair, MemoryFile};
use mdl::{NoProgress, RefName, Repository};

mod common;
use common::{safetensors_bytes, Rng};

fn floats(rng: &mut Rng, n: usize, scale: f64) -> Vec<u8> {
    (0..n)
        .flat_map(|_| ((rng.normal() * scale) as f32).to_le_bytes())
        .collect()
}

fn on(branch: &str) -> CommitOptions {
    CommitOptions {
        branch: Some(RefName::new(branch).unwrap()),
        ..Default::default()
    }
}

fn f(file: &str, name: &str) -> (String, String) {
    (file.to_string(), name.to_string())
}

#[test]
fn an_assembled_commit_is_the_union_of_its_parts() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(&dir.path().join("repo")).unwrap();
    let mut rng = Rng(7);
    // Part one: a parameter and its moments, paired by the caller.
    let model = safetensors_bytes(&[("w", "F32", vec![32, 32], floats(&mut rng, 1024, 0.02))]);
    let optim = safetensors_bytes(&[
        ("m", "F32", vec![32, 32], floats(&mut rng, 1024, 1e-3)),
        ("v", "F32", vec![32, 32], floats(&mut rng, 1024, 1e-6)),
    ]);
    let one = vec![
        ("model.safetensors".to_string(), model),
        ("optim.safetensors".to_string(), optim),
    ];
    let pair = KnownPair {
        param: f("model.safetensors", "w"),
        exp_avg: f("optim.safetensors", "m"),
        exp_avg_sq: f("optim.safetensors", "v"),
    };
    // Part two sorts first in the combined tree, so the pair's tensor numbers move.
    let shard = safetensors_bytes(&[("w@0", "F32", vec![8, 32], floats(&mut rng, 256, 0.02))]);
    let two = vec![
        ("a/rank-1.safetensors".to_string(), shard),
        ("notes.txt".to_string(), b"rank one".to_vec()),
    ];
    let want: Vec<(String, Vec<u8>)> = one.iter().chain(&two).cloned().collect();
    let files = |given: Vec<(String, Vec<u8>)>| -> Vec<MemoryFile> {
        given
            .into_iter()
            .map(|(path, bytes)| MemoryFile::new(path, bytes))
            .collect()
    };
    let (one, two) = (files(one), files(two));
    let a = commit_memory(&repo, one, &[pair], &on("part-0"), &NoProgress).unwrap();
    let b = commit_memory(&repo, two, &[], &on("part-1"), &NoProgress).unwrap();

    let opts = CommitOptions {
        message: "sharded save".into(),
        step: Some(12),
        ..on("main")
    };
    let whole = assemble(&repo, &[a.id, b.id], &opts).unwrap();
    assert_eq!(whole.branch, "main");
    assert_eq!(whole.raw_bytes, a.raw_bytes + b.raw_bytes);
    assert_eq!(whole.tensors, 4);
    assert_eq!(mdl::revision::resolve(&repo, "main").unwrap(), whole.id);

    let out = dir.path().join("out");
    checkout(
        &repo,
        "main",
        &out,
        &CheckoutOptions::default(),
        &NoProgress,
    )
    .unwrap();
    for (path, bytes) in want {
        assert_eq!(std::fs::read(out.join(&path)).unwrap(), bytes, "{path}");
    }
    let shown = mdl::show::show(&repo, "main").unwrap();
    assert_eq!(shown.step, Some(12));
    assert_eq!(shown.pairs.len(), 1);
    assert_eq!(shown.pairs[0].param, "model.safetensors: w");
    assert_eq!(shown.pairs[0].exp_avg, "optim.safetensors: m");
    assert_eq!(shown.pairs[0].exp_avg_sq, "optim.safetensors: v");

    // The next save builds on this one: its parent is the branch's commit.
    let again = assemble(&repo, &[b.id], &on("main")).unwrap();
    let commit = repo.load_commit(&again.id).unwrap();
    assert_eq!(commit.parents, vec![whole.id]);
}

#[test]
fn parts_that_overlap_are_refused_and_the_branch_stays() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(&dir.path().join("repo")).unwrap();
    let file = |text: &str| vec![MemoryFile::new("same.txt", text.as_bytes().to_vec())];
    let a = commit_memory(&repo, file("a"), &[], &on("main"), &NoProgress).unwrap();
    let b = commit_memory(&repo, file("b"), &[], &on("other"), &NoProgress).unwrap();
    // A file of one part being a folder of another does not combine either.
    let dir_part = vec![MemoryFile::new("same.txt/inner", b"x".to_vec())];
    let c = commit_memory(&repo, dir_part, &[], &on("third"), &NoProgress).unwrap();

    for parts in [vec![a.id, b.id], vec![a.id, c.id], vec![]] {
        let err = assemble(&repo, &parts, &on("main")).unwrap_err();
        assert!(
            err.to_string().starts_with("cannot assemble a commit: "),
            "{err}"
        );
        assert_eq!(mdl::revision::resolve(&repo, "main").unwrap(), a.id);
    }
}
