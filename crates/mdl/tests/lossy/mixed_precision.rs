//! Mixed-precision checkpoints (bf16 weights beside their fp32 master copy): one loss budget
//! across both copies, and a copy stored as its master's cast that follows the master's
//! reconstruction.

use std::path::Path;

use mdl::commit::{commit, CommitOptions};
use mdl::transfer::Shallow;
use mdl::NoProgress;
use mdl_codec::scalar;

use super::common::{read_safetensors, write_safetensors};
use super::{check_checkout, checkout_to, init_repo, lossy_opts, tensor, Model, NB};

/// `model`'s `b` as a mixed-precision run keeps it: a bf16 copy (`model.b`) and its fp32
/// master. `cast`: the copy is the master's cast, as trainers make it; otherwise it is rounded
/// from a tenth-of-a-percent different value (a copy mdl cannot derive from the master).
fn write_with_master(model: &Model, path: &Path, cast: bool) {
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let scale = if cast { 1.0 } else { 1.001 };
    let bf16 = model
        .b
        .iter()
        .flat_map(|&x| scalar::f32_to_bf16(x * scale).to_le_bytes())
        .collect();
    let shape = vec![128, 256];
    write_safetensors(
        path,
        &[
            ("model.b", "BF16", shape.clone(), bf16),
            ("optim.b.master", "F32", shape.clone(), f32s(&model.b)),
            ("optim.b.exp_avg", "F32", shape.clone(), f32s(&model.m["b"])),
            ("optim.b.exp_avg_sq", "F32", shape, f32s(&model.v["b"])),
        ],
    );
}

#[test]
fn a_mixed_precision_commit_spends_one_budget_across_its_copies() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(&dir.path().join("repo"));
    let mut model = Model::new();
    model.steps(5);
    let file = dir.path().join("c.safetensors");
    // A copy that is not the master's cast is priced as a copy of its own.
    write_with_master(&model, &file, false);
    let c = commit(&repo, &file, &lossy_opts(model.step, None), &NoProgress).unwrap();
    let s = c.search.unwrap();
    assert_eq!(s.budget, 0.01 * 2.5);
    // Both copies were priced, each named, and together they keep to the one budget.
    let copies: Vec<&str> = s.copies.iter().map(|c| c.copy.as_str()).collect();
    assert_eq!(copies, ["model.{}", "optim.{}.master"], "{s:?}");
    assert!(s
        .copies
        .iter()
        .all(|c| c.priced == 1 && c.est_delta_loss > 0.0));
    let by_copy: f64 = s.copies.iter().map(|c| c.est_delta_loss).sum();
    assert!((by_copy - s.est_delta_loss).abs() <= 1e-9 * s.budget);
    assert!(s.est_delta_loss <= s.budget, "{s:?}");
    // Each record says which copy its estimate is for, and the records add up the same.
    let shown = mdl::show::show(&repo, &c.id.to_string()).unwrap();
    let mut recorded = 0.0;
    for t in shown.tensors.iter().filter(|t| !t.name.contains("exp_avg")) {
        let l = t.lossy_info.as_ref().expect("both copies quantized");
        let copy = if t.name.starts_with("model.") {
            "model.{}"
        } else {
            "optim.{}.master"
        };
        assert_eq!(l.copy.as_deref(), Some(copy), "{}", t.name);
        let word = format!("copy={copy}");
        assert!(l.settings.split(' ').any(|w| w == word), "{}", l.settings);
        recorded += l.est_delta_loss.unwrap();
    }
    assert!(
        recorded <= s.budget * (1.0 + 1e-6),
        "{recorded} > {}",
        s.budget
    );
    assert!((recorded - s.est_delta_loss).abs() <= 1e-6 * s.budget);
    check_checkout(&repo, "HEAD", &file, &dir.path().join("out"));
}

#[test]
fn a_bf16_copy_is_stored_as_the_cast_of_its_master_and_follows_its_reconstruction() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(&dir.path().join("repo"));
    let mut model = Model::new();
    model.steps(5);
    let file = dir.path().join("c.safetensors");
    let codec = |rev: &str, name: &str| {
        let shown = mdl::show::show(&repo, rev).unwrap();
        let t = shown.tensors.into_iter().find(|t| t.name == name).unwrap();
        (t.codec, t.stored_bytes, t.lossy_info)
    };
    // Exactly: the copy's record is a few bytes, and checks out byte for byte.
    write_with_master(&model, &file, true);
    let lossless = CommitOptions {
        step: Some(model.step),
        ..Default::default()
    };
    commit(&repo, &file, &lossless, &NoProgress).unwrap();
    let (c, stored, lossy) = codec("HEAD", "model.b");
    assert_eq!(c, "cast");
    assert!(lossy.is_none());
    assert!(stored < 200, "{stored} bytes");
    check_checkout(&repo, "HEAD", &file, &dir.path().join("exact"));
    // Lossily, over a few steps: the master alone is priced; the copy is the cast of its
    // reconstruction everywhere, with the error that makes recorded as measured.
    for _ in 0..3 {
        model.steps(1);
        write_with_master(&model, &file, true);
        let c = commit(&repo, &file, &lossy_opts(model.step, None), &NoProgress).unwrap();
        let s = c.search.unwrap();
        let copies: Vec<&str> = s.copies.iter().map(|c| c.copy.as_str()).collect();
        assert_eq!(copies, ["optim.{}.master"], "{s:?}");
        assert!(s.est_delta_loss <= s.budget, "{s:?}");
        let (c, _, lossy) = codec("HEAD", "model.b");
        assert_eq!(c, "cast");
        let lossy = lossy.expect("the copy follows a quantized master");
        assert_eq!(lossy.est_delta_loss, None);
        let out = dir.path().join("out");
        check_checkout(&repo, "HEAD", &file, &out);
        let got = read_safetensors(&out);
        let (master, copy) = (&got["optim.b.master"].2, &got["model.b"].2);
        assert_ne!(master[..], read_safetensors(&file)["optim.b.master"].2[..]);
        let differ = (0..NB)
            .filter(|&i| {
                let m = f32::from_le_bytes(master[4 * i..4 * i + 4].try_into().unwrap());
                scalar::f32_to_bf16(m).to_le_bytes() != copy[2 * i..2 * i + 2]
            })
            .count();
        assert_eq!(differ, 0, "bf16 elements that are not the master's cast");
    }
    assert!(mdl::fsck::fsck(&repo, false).unwrap().problems.is_empty());
    // Another repository receives the casts with their masters and checks them out the same.
    let tip = mdl::revision::resolve(&repo, "HEAD").unwrap();
    let plan = mdl::transfer::plan(&repo, &[tip], &|_| false, &Shallow::WHOLE).unwrap();
    let ids: Vec<_> = plan.iter().map(|p| p.id).collect();
    let mut pack = Vec::new();
    mdl::transfer::write_pack(&repo, &ids, &mut pack).unwrap();
    let other = init_repo(&dir.path().join("other"));
    mdl::transfer::receive_pack(&other, &mut &pack[..], u64::MAX).unwrap();
    let (here, there) = (dir.path().join("here"), dir.path().join("there"));
    checkout_to(&repo, &tip.to_string(), &here);
    checkout_to(&other, &tip.to_string(), &there);
    assert!(std::fs::read(&here).unwrap() == std::fs::read(&there).unwrap());
    assert!(mdl::fsck::fsck(&other, false).unwrap().problems.is_empty());
}

#[test]
fn the_eval_command_scores_a_copy_that_follows_its_candidate_master() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(&dir.path().join("repo"));
    let mut model = Model::new();
    model.steps(5);
    let file = dir.path().join("c.safetensors");
    write_with_master(&model, &file, true);
    // The command keeps every candidate it is given.
    let seen = dir.path().join("seen");
    std::fs::create_dir(&seen).unwrap();
    let mut opts = lossy_opts(model.step, None);
    opts.lossy.eval_cmd = Some(format!(
        "cp {{}} {}/$(date +%s%N).safetensors && echo loss 2.5",
        seen.display()
    ));
    commit(&repo, &file, &opts, &NoProgress).unwrap();
    let original = read_safetensors(&file);
    let mut quantized = 0;
    for e in std::fs::read_dir(&seen).unwrap() {
        let got = read_safetensors(&e.unwrap().path());
        let (master, copy) = (&got["optim.b.master"].2, &got["model.b"].2);
        quantized += usize::from(master[..] != original["optim.b.master"].2[..]);
        for i in 0..NB {
            let m = f32::from_le_bytes(master[4 * i..4 * i + 4].try_into().unwrap());
            assert_eq!(
                scalar::f32_to_bf16(m).to_le_bytes(),
                copy[2 * i..2 * i + 2],
                "element {i}"
            );
        }
    }
    assert!(quantized >= 1, "no candidate quantized the master");
}

#[test]
fn a_copy_that_only_looks_like_a_cast_is_stored_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(&dir.path().join("repo"));
    // Every other element differs from the master's cast: a sample of every other element
    // sees none of them.
    let n = 1usize << 17;
    let master: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 1000) as f32 - 500.0) * 1e-4)
        .collect();
    let copy: Vec<u8> = (master.iter().enumerate())
        .flat_map(|(i, &x)| (scalar::f32_to_bf16(x) ^ (i as u16 & 1)).to_le_bytes())
        .collect();
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let moment: Vec<f32> = master.iter().map(|x| x.abs() * 1e-3 + 1e-8).collect();
    let file = dir.path().join("c.safetensors");
    let shape = vec![n as u64];
    write_safetensors(
        &file,
        &[
            ("model.c", "BF16", shape.clone(), copy),
            ("optim.c.master", "F32", shape.clone(), f32s(&master)),
            ("optim.c.exp_avg", "F32", shape.clone(), f32s(&moment)),
            ("optim.c.exp_avg_sq", "F32", shape, f32s(&moment)),
        ],
    );
    let opts = CommitOptions {
        step: Some(10),
        ..Default::default()
    };
    commit(&repo, &file, &opts, &NoProgress).unwrap();
    let shown = mdl::show::show(&repo, "HEAD").unwrap();
    let t = tensor(&shown, "model.c");
    assert_ne!(t.codec, "cast");
    check_checkout(&repo, "HEAD", &file, &dir.path().join("out"));
}

#[test]
fn a_cast_whose_master_gc_deletes_is_stored_whole_first() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(&dir.path().join("repo"));
    let n = 4096usize;
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let write = |master: &[f32], path: &Path| {
        let copy: Vec<u8> = master
            .iter()
            .flat_map(|&x| scalar::f32_to_bf16(x).to_le_bytes())
            .collect();
        let moment: Vec<f32> = master.iter().map(|x| x.abs() * 1e-3 + 1e-8).collect();
        let shape = vec![n as u64];
        write_safetensors(
            path,
            &[
                ("model.c", "BF16", shape.clone(), copy),
                ("optim.c.master", "F32", shape.clone(), f32s(master)),
                ("optim.c.exp_avg", "F32", shape.clone(), f32s(&moment)),
                ("optim.c.exp_avg_sq", "F32", shape, f32s(&moment)),
            ],
        );
    };
    // Two masters one unit in the last place apart where that keeps their bf16 cast: the
    // copy is one object, its record a cast of the first master.
    let first: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 1000) as f32 - 500.0) * 1e-4)
        .collect();
    let second: Vec<f32> = (first.iter())
        .map(|&x| {
            let y = f32::from_bits(x.to_bits() ^ 1);
            match scalar::f32_to_bf16(y) == scalar::f32_to_bf16(x) {
                true => y,
                false => x,
            }
        })
        .collect();
    assert_ne!(first, second);
    let (a, b) = (
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    );
    write(&first, &a);
    write(&second, &b);
    // The first commit arrives from elsewhere and no ref names it; the second is main's.
    let elsewhere = init_repo(&dir.path().join("elsewhere"));
    let c = commit(&elsewhere, &a, &CommitOptions::default(), &NoProgress).unwrap();
    let plan = mdl::transfer::plan(&elsewhere, &[c.id], &|_| false, &Shallow::WHOLE).unwrap();
    let ids: Vec<_> = plan.iter().map(|p| p.id).collect();
    let mut pack = Vec::new();
    mdl::transfer::write_pack(&elsewhere, &ids, &mut pack).unwrap();
    mdl::transfer::receive_pack(&repo, &mut &pack[..], u64::MAX).unwrap();
    commit(&repo, &b, &CommitOptions::default(), &NoProgress).unwrap();
    let codec = || {
        let shown = mdl::show::show(&repo, "main").unwrap();
        let t = shown
            .tensors
            .into_iter()
            .find(|t| t.name == "model.c")
            .unwrap();
        t.codec
    };
    assert_eq!(codec(), "cast");
    // The first commit goes, and its master with it: the copy main still names is re-encoded
    // on its own first.
    let gc = mdl::gc::GcOptions {
        prune_older_than: std::time::Duration::ZERO,
        expire_reflog: std::time::Duration::ZERO,
        dry_run: false,
        count_leftovers: true,
    };
    let out = mdl::gc::gc(&repo, &gc, &NoProgress).unwrap();
    assert!(out.reencoded >= 1, "{out:?}");
    assert_ne!(codec(), "cast");
    check_checkout(&repo, "main", &b, &dir.path().join("out"));
    assert!(mdl::fsck::fsck(&repo, false).unwrap().problems.is_empty());
}
