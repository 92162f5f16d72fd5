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
    state_bytes(seed)
        .into_iter()
        .map(|(path, bytes)| MemoryFile::new(path, bytes))
        .collect()
}

/// [`state`]'s files as `(path, bytes)`.
fn state_bytes(seed: u64) -> Vec<(String, Vec<u8>)> {
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
        ("model.safetensors".into(), model),
        ("optim/moments.safetensors".into(), optim),
        ("extra.json".into(), br#"{"step": 3}"#.to_vec()),
    ]
}

type Part = Box<dyn AsRef<[u8]> + Send + Sync>;

/// A safetensors file cut where a Python caller hands it over: the header, then each tensor's
/// bytes a part of its own.
fn cut_into_parts(file: &[u8]) -> Vec<Part> {
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&file[8..8 + n]).unwrap();
    let mut cuts = vec![8 + n, file.len()];
    for t in header.as_object().unwrap().values() {
        cuts.push(8 + n + t["data_offsets"][0].as_u64().unwrap() as usize);
    }
    cuts.sort();
    cuts.dedup();
    let mut parts = vec![Box::new(file[..8 + n].to_vec()) as Part];
    parts.extend(
        cuts.windows(2)
            .map(|w| Box::new(file[w[0]..w[1]].to_vec()) as Part),
    );
    parts
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
    let want = state_bytes(1);
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

/// The tensors `rev` records, by file and name: id, codec and record size.
fn tensor_ids(repo: &Repository, rev: &str) -> Vec<(String, String, String, String, u64)> {
    let shown = mdl::show::show(repo, rev).unwrap();
    let mut ids: Vec<_> = shown
        .tensors
        .iter()
        .map(|t| {
            let id = t.id.to_string();
            (
                t.file.clone(),
                t.name.clone(),
                id,
                t.codec.clone(),
                t.stored_bytes,
            )
        })
        .collect();
    ids.sort();
    ids
}

#[test]
fn a_state_given_in_parts_commits_as_the_same_bytes_do() {
    let dir = tempfile::tempdir().unwrap();
    let whole = Repository::init(&dir.path().join("whole")).unwrap();
    let parts = Repository::init(&dir.path().join("parts")).unwrap();
    let opts = |step| CommitOptions {
        step: Some(step),
        ..Default::default()
    };
    let pairs = [pair("layers.0.q", "m_q", "v_q")];
    for seed in [1, 2] {
        commit_memory(&whole, state(seed), &pairs, &opts(seed), &NoProgress).unwrap();
        let files = state_bytes(seed)
            .into_iter()
            .map(|(path, bytes)| match path.ends_with(".safetensors") {
                true => MemoryFile::in_parts(path, cut_into_parts(&bytes)),
                false => MemoryFile::new(path, bytes),
            })
            .collect();
        commit_memory(&parts, files, &pairs, &opts(seed), &NoProgress).unwrap();
        assert_eq!(tensor_ids(&parts, "main"), tensor_ids(&whole, "main"));
    }
    let out = dir.path().join("out");
    checkout(
        &parts,
        "main~1",
        &out,
        &CheckoutOptions::default(),
        &NoProgress,
    )
    .unwrap();
    for (path, bytes) in state_bytes(1) {
        assert_eq!(std::fs::read(out.join(&path)).unwrap(), bytes, "{path}");
    }
}

#[test]
fn parts_that_cut_through_a_tensor_or_hold_no_safetensors_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(&dir.path().join("repo")).unwrap();
    let commit = |files| commit_memory(&repo, files, &[], &CommitOptions::default(), &NoProgress);
    let [(model, bytes), ..] = &state_bytes(1)[..] else {
        unreachable!()
    };
    // The second tensor's bytes cut in two: its bytes span two parts.
    let mut parts = cut_into_parts(bytes);
    let last = parts.pop().unwrap();
    let last = (*last).as_ref().to_vec();
    let half = last.len() / 2;
    parts.push(Box::new(last[..half].to_vec()));
    parts.push(Box::new(last[half..].to_vec()));
    let e = commit(vec![MemoryFile::in_parts(model.clone(), parts)]).unwrap_err();
    assert!(e.to_string().contains("span two of the parts"), "{e}");
    // The header cut short: its first part does not hold it.
    let mut parts = cut_into_parts(bytes);
    let head = (*parts[0]).as_ref().to_vec();
    parts.splice(
        0..1,
        [
            Box::new(head[..20].to_vec()) as Part,
            Box::new(head[20..].to_vec()),
        ],
    );
    let e = commit(vec![MemoryFile::in_parts(model.clone(), parts)]).unwrap_err();
    assert!(
        e.to_string().contains("not lie within its first part"),
        "{e}"
    );
    // JSON in parts is not a safetensors file.
    let json = br#"{"step": 3}"#;
    let parts: Vec<Part> = vec![Box::new(json[..4].to_vec()), Box::new(json[4..].to_vec())];
    let e = commit(vec![MemoryFile::in_parts("extra.json", parts)]).unwrap_err();
    assert!(e.to_string().contains("extra.json"), "{e}");
    let log = mdl::log::log(&repo, None, None).unwrap();
    assert!(log.is_empty(), "no commit was made");
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
