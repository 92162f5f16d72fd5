//! Adam's betas of a lossy commit's estimate: taken from the configuration, else from what the
//! checkpoint records, else β2 from the second moments' decay since the parent, else PyTorch's
//! defaults; recorded by every priced tensor and shown by `mdl show`.

#![allow(clippy::disallowed_methods)]

use std::path::Path;

use mdl::commit::{commit, CommitOptions, CommitOutcome};
use mdl::lossy::{CodecMode, LossyRequest};
use mdl::{NoProgress, Repository};

mod common;
use common::{read_safetensors, safetensors_bytes, Rng};

/// A parameter and its Adam moments trained with `beta2`, saved every `every` steps.
struct Run {
    rng: Rng,
    w: Vec<f32>,
    m: Vec<f32>,
    v: Vec<f32>,
    beta2: f32,
    step: u64,
}

const N: usize = 128 * 256;

impl Run {
    fn new(beta2: f32) -> Run {
        let mut rng = Rng(42);
        let w = (0..N).map(|_| (rng.normal() * 0.02) as f32).collect();
        Run {
            rng,
            w,
            m: vec![0.0; N],
            v: vec![0.0; N],
            beta2,
            step: 0,
        }
    }

    /// `k` steps; after step 10, one element in eight sees no gradient (a token that stopped
    /// occurring in the batches).
    fn steps(&mut self, k: u64) {
        for _ in 0..k {
            self.step += 1;
            for i in 0..N {
                let g = if i.is_multiple_of(8) && self.step > 10 {
                    0.0
                } else {
                    (self.rng.normal() * 0.01) as f32 + 0.1 * self.w[i]
                };
                self.m[i] = 0.9 * self.m[i] + 0.1 * g;
                self.v[i] = self.beta2 * self.v[i] + (1.0 - self.beta2) * g * g;
                self.w[i] -= 1e-3 * self.m[i] / (self.v[i].sqrt() + 1e-8);
            }
        }
    }

    /// The checkpoint, with `metadata` in its header.
    fn write(&self, path: &Path, metadata: &[(&str, &str)]) {
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let bytes = safetensors_bytes(&[
            ("model.w", "F32", vec![128, 256], f32s(&self.w)),
            ("optim.w.exp_avg", "F32", vec![128, 256], f32s(&self.m)),
            ("optim.w.exp_avg_sq", "F32", vec![128, 256], f32s(&self.v)),
        ]);
        // safetensors_bytes writes no metadata: splice it into the header.
        let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let mut header: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&bytes[8..8 + len]).unwrap();
        if !metadata.is_empty() {
            let meta = metadata
                .iter()
                .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
                .collect();
            header.insert("__metadata__".into(), serde_json::Value::Object(meta));
        }
        let mut text = serde_json::to_vec(&header).unwrap();
        text.resize(text.len().div_ceil(8) * 8, b' ');
        let mut out = (text.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&text);
        out.extend_from_slice(&bytes[8 + len..]);
        std::fs::write(path, out).unwrap();
    }
}

fn lossy_commit(repo: &Repository, file: &Path, step: u64) -> CommitOutcome {
    let opts = CommitOptions {
        step: Some(step),
        metrics: vec![("loss".into(), 2.0)],
        lossy: LossyRequest {
            mode: Some(CodecMode::Lossy),
            ..Default::default()
        },
        ..Default::default()
    };
    commit(repo, file, &opts, &NoProgress).unwrap()
}

/// What `mdl show` says of a commit's betas: the values and the source.
fn shown(repo: &Repository, rev: &str) -> (f64, f64, String) {
    let s = mdl::show::show(repo, rev).unwrap();
    let text = s.adam_betas.expect("a priced commit shows its betas");
    let (values, source) = text.split_once(' ').unwrap();
    let (b1, b2) = values.split_once(',').unwrap();
    (b1.parse().unwrap(), b2.parse().unwrap(), source.to_string())
}

#[test]
fn betas_come_from_config_then_checkpoint_then_decay_then_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(&dir.path().join("repo")).unwrap();
    let mut run = Run::new(0.95);
    let file = dir.path().join("ckpt.safetensors");

    // Nothing recorded, no parent: PyTorch's defaults.
    run.steps(10);
    run.write(&file, &[]);
    lossy_commit(&repo, &file, 10);
    assert_eq!(
        shown(&repo, "HEAD"),
        (
            0.9,
            0.999,
            "(PyTorch's defaults: nothing recorded them)".into()
        )
    );

    // The next commit reads β2 off the decay since step 10: an upper bound, loose against a
    // second moment coded by a table (only its largest absolute error is known), close
    // against a log-domain residual (known within half a step).
    run.steps(10);
    run.write(&file, &[]);
    let inferred = lossy_commit(&repo, &file, 20);
    let (b1, b2, source) = shown(&repo, "HEAD");
    assert_eq!(b1, 0.9);
    assert!((0.95..0.99).contains(&b2), "{b2}");
    assert_eq!(
        source,
        "(β2 inferred from exp_avg_sq's decay since step 10)"
    );
    assert!(inferred
        .search
        .unwrap()
        .adam_betas
        .unwrap()
        .contains("inferred"));
    run.steps(10);
    run.write(&file, &[]);
    lossy_commit(&repo, &file, 30);
    let (_, b2, source) = shown(&repo, "HEAD");
    assert!((0.95..0.952).contains(&b2), "{b2}");
    assert_eq!(
        source,
        "(β2 inferred from exp_avg_sq's decay since step 20)"
    );

    // The same two checkpoints priced with PyTorch's β2 store more: early in training 0.999
    // makes v̂ 30 times larger, so every error looks dearer.
    let other = Repository::init(&dir.path().join("other")).unwrap();
    mdl::config::set_config(&other, "quant.adam_betas", "0.9,0.999").unwrap();
    let mut again = Run::new(0.95);
    again.steps(10);
    again.write(&file, &[("adam_betas", "0.8,0.97")]);
    lossy_commit(&other, &file, 10);
    // The configuration wins over what the checkpoint records.
    assert_eq!(
        shown(&other, "HEAD"),
        (0.9, 0.999, "(set by quant.adam_betas)".into())
    );
    again.steps(10);
    again.write(&file, &[]);
    let defaults = lossy_commit(&other, &file, 20);
    assert!(
        defaults.stored_bytes > inferred.stored_bytes * 11 / 10,
        "{} against {}",
        defaults.stored_bytes,
        inferred.stored_bytes
    );

    // `auto` again: recorded betas are read (safetensors metadata here), before any decay.
    mdl::config::set_config(&other, "quant.adam_betas", "auto").unwrap();
    again.steps(10);
    again.write(&file, &[("adam_beta1", "0.8"), ("adam_beta2", "0.97")]);
    lossy_commit(&other, &file, 30);
    assert_eq!(
        shown(&other, "HEAD"),
        (0.8, 0.97, "(recorded in ckpt.safetensors)".into())
    );
    // Every tensor priced with its moments records them.
    let s = mdl::show::show(&other, "HEAD").unwrap();
    let priced = s
        .tensors
        .iter()
        .filter_map(|t| t.lossy_info.as_ref())
        .filter(|l| l.settings.contains("sensitivity=moments"))
        .collect::<Vec<_>>();
    assert!(!priced.is_empty());
    for l in priced {
        assert!(
            l.settings
                .contains("betas=0.8,0.97 betas_from=checkpoint:ckpt.safetensors"),
            "{}",
            l.settings
        );
    }
    // A value that is not two betas is refused, and nothing changes.
    let err = mdl::config::set_config(&other, "quant.adam_betas", "0.9").unwrap_err();
    assert!(err.to_string().contains("auto, or BETA1,BETA2"), "{err}");
}

#[test]
fn a_checkpoint_without_moments_reports_the_relative_bound_not_a_loss() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(&dir.path().join("repo")).unwrap();
    // A pretrained base saved with a fresh optimizer: every moment is zero.
    let run = Run::new(0.95);
    let file = dir.path().join("base.safetensors");
    run.write(&file, &[]);
    let c = lossy_commit(&repo, &file, 0);
    let s = c.search.unwrap();
    assert!(c.lossy_tensors > 0);
    assert_eq!((s.priced, s.relative), (0, 1));
    assert_eq!(s.est_delta_loss, 0.0);
    // Nothing was priced with moments, so no betas are claimed for it.
    assert_eq!(s.adam_betas, None);
    assert_eq!(mdl::show::show(&repo, "HEAD").unwrap().adam_betas, None);
}

/// The second moments' log step follows β2: two octaves where `v` forgets within about 25
/// steps (β2 ≤ 0.96), one octave for a longer memory; either way every element of the checkout
/// is within half a step of what was committed.
#[test]
fn second_moments_take_two_octaves_when_they_forget_fast() {
    let dir = tempfile::tempdir().unwrap();
    for (betas, octaves) in [("0.9,0.95", 2.0), ("0.9,0.999", 1.0)] {
        let repo = Repository::init(&dir.path().join(betas)).unwrap();
        mdl::config::set_config(&repo, "quant.adam_betas", betas).unwrap();
        let mut run = Run::new(0.95);
        let file = dir.path().join("ckpt.safetensors");
        // The first commit codes `v` against its factors; the second against the first.
        for step in [10, 20] {
            run.steps(10);
            run.write(&file, &[]);
            lossy_commit(&repo, &file, step);
            let s = mdl::show::show(&repo, "HEAD").unwrap();
            let v = s
                .tensors
                .iter()
                .find(|t| t.name == "optim.w.exp_avg_sq")
                .unwrap();
            let settings = &v.lossy_info.as_ref().expect("a lossy v").settings;
            assert!(
                settings.contains(&format!("mode=log step={octaves:e}")),
                "{betas} at step {step}: {settings}"
            );
            let out = dir.path().join("out.safetensors");
            let opts = mdl::checkout::CheckoutOptions {
                force: true,
                ..Default::default()
            };
            mdl::checkout::checkout(&repo, "HEAD", &out, &opts, &NoProgress).unwrap();
            let read = |path: &Path| {
                let (_, _, bytes) = read_safetensors(path).remove("optim.w.exp_avg_sq").unwrap();
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)
                    .collect::<Vec<_>>()
            };
            let (committed, restored) = (read(&file), read(&out));
            let worst = committed
                .iter()
                .zip(&restored)
                .filter(|(c, _)| **c > 0.0)
                .map(|(c, r)| (r / c).log2().abs())
                .fold(0.0, f64::max);
            assert!(
                worst <= octaves / 2.0 + 1e-6,
                "{betas} at step {step}: {worst} octaves"
            );
            // Coarse enough to use most of its half step somewhere.
            assert!(worst > octaves / 4.0, "{betas} at step {step}: {worst}");
        }
    }
}
