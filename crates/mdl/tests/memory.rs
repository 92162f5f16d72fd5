//! Commits of files given as bytes, with the moment pairs the committer knows: what a training
//! process's client builds on. Lossless commits check out byte for
//! byte; the client's pairs are the ones a lossy commit uses and records; bad input changes
//! nothing.

#![allow(clippy::disallowed_methods)]

use mdl::checkout::{checkout, CheckoutOptions};
use mdl::commit::{commit_memory, CommitOptions, KnownPair, MemoryFile};
use mdl::lossy::{CodecMode, LossyRequest};
use mdl::{NoProgress, Repository};

mod common;
use common::{safetensors_bytes, Rng};

fn floats(rng: &mut Rng, n: usize, scale: f64) -> Vec<u8> {
    (0..n)
        .flat_map(|_| ((rng.normal() * scale) as f32).to_le_bytes())
        .collect()
}

/// Weights under names a client knows, and moments under names no pattern or order would pair
/// (two weights of one shape, so the optimizer's order cannot either).
fn state(seed: u64) -> Vec<MemoryFile> {
    let mut rng = Rng(seed);
    let model = safetensors_bytes(&[
        (
            "layers.0.q",
            "F32",
            vec![64, 64],
            floats(&mut rng, 4096, 0.02),
        ),
        (
            "layers.0.o",
            "F32",
            vec![64, 64],
            floats(&mut rng, 4096, 0.02),
        ),
    ]);
    let optim = safetensors_bytes(&[
        ("m_q", "F32", vec![64, 64], floats(&mut rng, 4096, 1e-3)),
        (
            "v_q",
            "F32",
            vec![64, 64],
            floats(&mut rng, 4096, 1e-6)
                .iter()
                .map(|b| b & 0x7f)
                .collect(),
        ),
        ("m_o", "F32", vec![64, 64], floats(&mut rng, 4096, 1e-3)),
        (
            "v_o",
            "F32",
            vec![64, 64],
            floats(&mut rng, 4096, 1e-6)
                .iter()
                .map(|b| b & 0x7f)
                .collect(),
        ),
    ]);
    vec![
        MemoryFile::new("model.safetensors", model),
        MemoryFile::new("optim/moments.safetensors", optim),
        MemoryFile::new("extra.json", br#"{"step": 3}"#.to_vec()),
    ]
}

fn pair(p: &str, m: &str, v: &str) -> KnownPair {
    let f = |file: &str, name: &str| (file.to_string(), name.to_string());
    KnownPair {
        param: f("model.safetensors", p),
        exp_avg: f("optim/moments.safetensors", m),
        exp_avg_sq: f("optim/moments.safetensors", v),
    }
}

#[test]
fn bytes_commit_and_check_out_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(&dir.path().join("repo")).unwrap();
    let files = state(1);
    let want: Vec<(String, Vec<u8>)> = files
        .iter()
        .map(|f| (f.path.clone(), f.bytes().to_vec()))
        .collect();
    let opts = CommitOptions {
        step: Some(3),
        ..Default::default()
    };
    commit_memory(
        &repo,
        files,
        &[pair("layers.0.q", "m_q", "v_q")],
        &opts,
        &NoProgress,
    )
    .unwrap();
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
    assert_eq!(shown.step, Some(3));
    assert_eq!(shown.pairs.len(), 1);
    assert_eq!(shown.pairs[0].source, "client");
    assert_eq!(shown.pairs[0].exp_avg, "optim/moments.safetensors: m_q");
}

#[test]
fn a_lossy_commit_uses_the_clients_pairs() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(&dir.path().join("repo")).unwrap();
    let opts = CommitOptions {
        step: Some(3),
        metrics: vec![("loss".into(), 2.0)],
        lossy: LossyRequest {
            mode: Some(CodecMode::Lossy),
            ..Default::default()
        },
        ..Default::default()
    };
    let pairs = [
        pair("layers.0.q", "m_q", "v_q"),
        pair("layers.0.o", "m_o", "v_o"),
    ];
    commit_memory(&repo, state(2), &pairs, &opts, &NoProgress).unwrap();
    let shown = mdl::show::show(&repo, "main").unwrap();
    assert_eq!(shown.pairs.len(), 2);
    assert!(shown.pairs.iter().all(|p| p.source == "client"));
    for t in shown
        .tensors
        .iter()
        .filter(|t| t.file == "model.safetensors")
    {
        if let Some(l) = &t.lossy_info {
            assert_eq!(l.sensitivity.as_deref(), Some("moments"), "{}", t.name);
            assert!(l.est_delta_loss.is_some(), "{}", t.name);
        }
    }
}

#[test]
fn bad_input_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(&dir.path().join("repo")).unwrap();
    let opts = CommitOptions::default();
    // A pair naming a tensor that is not there, a path that escapes, a path given twice.
    let e = commit_memory(
        &repo,
        state(3),
        &[pair("nope", "m_q", "v_q")],
        &opts,
        &NoProgress,
    )
    .unwrap_err();
    assert!(e.to_string().contains("nope"), "{e}");
    let mut files = state(3);
    files[2].path = "../extra.json".into();
    assert!(commit_memory(&repo, files, &[], &opts, &NoProgress).is_err());
    let mut files = state(3);
    files[2].path = "model.safetensors".into();
    assert!(commit_memory(&repo, files, &[], &opts, &NoProgress).is_err());
    let log = mdl::log::log(&repo, None, None).unwrap();
    assert!(log.is_empty(), "no commit was made");
}
