//! Lossy commits through the library: quant chains over codes (forward and reverse, with table
//! size changes), checkouts in the original dtypes and shapes, recorded errors equal to the
//! errors of the checkout, the search within its budget, mantissa-trim, `--eval-cmd`, and
//! retention's coarsening of older commits.

// Tests write their own files (checkpoints to commit again); the rule that repository writes
// go through mdl-store is for the library crates.
#![allow(clippy::disallowed_methods)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mdl::checkout::{checkout, CheckoutOptions};
use mdl::commit::{commit, CommitOptions};
use mdl::lossy::{CodecMode, LossyRequest};
use mdl::policy::{DeltaMode, DeltaPolicy};
use mdl::{NoProgress, Repository};
use mdl_codec::scalar;
use mdl_format::Dtype;

#[path = "../common/mod.rs"]
mod common;
mod mixed_precision;
mod moments;
mod steps;
use common::{adam_step, read_safetensors, write_safetensors, Rng};

/// A small model in training: an f32 matrix, a bf16 matrix, a norm vector, Adam moments.
struct Model {
    rng: Rng,
    a: Vec<f32>,
    b: Vec<f32>,
    ln: Vec<f32>,
    m: HashMap<&'static str, Vec<f32>>,
    v: HashMap<&'static str, Vec<f32>>,
    step: u64,
}

const NA: usize = 256 * 256;
const NB: usize = 128 * 256;

impl Model {
    fn new() -> Model {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let a = (0..NA).map(|_| (rng.normal() * 0.02) as f32).collect();
        let b = (0..NB).map(|_| (rng.normal() * 0.05) as f32).collect();
        let mut m = HashMap::new();
        let mut v = HashMap::new();
        for (k, n) in [("a", NA), ("b", NB)] {
            m.insert(k, vec![0.0; n]);
            v.insert(k, vec![0.0; n]);
        }
        Model {
            rng,
            a,
            b,
            ln: vec![1.0; 256],
            m,
            v,
            step: 0,
        }
    }

    fn steps(&mut self, k: usize) {
        for _ in 0..k {
            self.step += 1;
            for (name, w) in [("a", &mut self.a), ("b", &mut self.b)] {
                let (m, v) = (self.m.get_mut(name).unwrap(), self.v.get_mut(name).unwrap());
                let rng = &mut self.rng;
                adam_step(w, m, v, 1e-3, |w| {
                    (rng.normal() * 0.01 + w as f64 * 0.1) as f32
                });
            }
        }
    }

    fn write(&self, path: &Path) {
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let bf16 = self
            .b
            .iter()
            .flat_map(|&x| scalar::f32_to_bf16(x).to_le_bytes())
            .collect();
        write_safetensors(
            path,
            &[
                ("model.a", "F32", vec![256, 256], f32s(&self.a)),
                ("model.b", "BF16", vec![128, 256], bf16),
                ("model.ln", "F32", vec![256], f32s(&self.ln)),
                ("optim.a.exp_avg", "F32", vec![256, 256], f32s(&self.m["a"])),
                (
                    "optim.a.exp_avg_sq",
                    "F32",
                    vec![256, 256],
                    f32s(&self.v["a"]),
                ),
                ("optim.b.exp_avg", "F32", vec![128, 256], f32s(&self.m["b"])),
                (
                    "optim.b.exp_avg_sq",
                    "F32",
                    vec![128, 256],
                    f32s(&self.v["b"]),
                ),
                (
                    "optim.step",
                    "I64",
                    vec![],
                    (self.step as i64).to_le_bytes().to_vec(),
                ),
            ],
        );
    }
}

/// A repository whose loss estimate knows this model's curvature: its gradients are
/// `0.1·w` plus noise of 0.01 per step, so the Hessian (0.1) is about 1000 times Adam's `v`.
fn init_repo(path: &Path) -> Repository {
    let repo = Repository::init(path).unwrap();
    mdl::config::set_config(&repo, "quant.curvature", "1000").unwrap();
    repo
}

/// A repository and a model two steps into training, written to `c.safetensors`.
fn one_checkpoint() -> (tempfile::TempDir, Repository, Model, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(&dir.path().join("repo"));
    let mut model = Model::new();
    model.steps(2);
    let file = dir.path().join("c.safetensors");
    model.write(&file);
    (dir, repo, model, file)
}

/// Tensor `name` of a commit `mdl show` describes.
fn tensor<'a>(shown: &'a mdl::show::Shown, name: &str) -> &'a mdl::show::TensorInfo {
    shown.tensors.iter().find(|t| t.name == name).unwrap()
}

fn checkout_to(repo: &Repository, rev: &str, out: &Path) {
    let opts = CheckoutOptions {
        force: true,
        ..Default::default()
    };
    checkout(repo, rev, out, &opts, &NoProgress).unwrap();
}

fn lossy_opts(step: u64, delta: Option<DeltaPolicy>) -> CommitOptions {
    CommitOptions {
        step: Some(step),
        metrics: vec![("loss".into(), 2.5)],
        delta,
        lossy: LossyRequest {
            mode: Some(CodecMode::Lossy),
            epsilon: Some(0.01),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Checks a lossy checkout against its original: same names, dtypes and shapes; lossless
/// tensors identical; lossy ones with exactly the recorded errors.
fn check_checkout(repo: &Repository, rev: &str, original: &Path, out: &Path) {
    checkout_to(repo, rev, out);
    let (orig, got) = (read_safetensors(original), read_safetensors(out));
    assert_eq!(orig.len(), got.len());
    let shown = mdl::show::show(repo, rev).unwrap();
    for t in &shown.tensors {
        let (od, os, ob) = &orig[&t.name];
        let (gd, gs, gb) = &got[&t.name];
        assert_eq!((od, os), (gd, gs), "{}: dtype/shape", t.name);
        let Some(l) = &t.lossy_info else {
            assert_eq!(ob, gb, "{} is lossless", t.name);
            continue;
        };
        let n = ob.len() / od.size();
        let (mut max, mut se, mut ss) = (0.0f64, 0.0f64, 0.0f64);
        for i in 0..n {
            let (x, y) = (scalar::value(*od, ob, i), scalar::value(*od, gb, i));
            max = max.max((y - x).abs());
            se += (y - x) * (y - x);
            ss += x * x;
        }
        assert_eq!(max, l.max_abs_error, "{}: max abs error", t.name);
        let rel = (se / ss).sqrt();
        assert!(
            (rel - l.rel_error).abs() <= 1e-9 * rel,
            "{}: rel error {rel} vs recorded {}",
            t.name,
            l.rel_error
        );
    }
}

fn chain_with_table_changes(mode: DeltaMode, moment_residuals: bool) {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(&dir.path().join("repo"));
    let on_off = if moment_residuals { "on" } else { "off" };
    mdl::config::set_config(&repo, "quant.moment_residuals", on_off).unwrap();
    let policy = DeltaPolicy {
        mode,
        max_depth: 16,
        max_restore_cost: None,
        defer: false,
    };
    let mut model = Model::new();
    let mut outs = Vec::new();
    // The moments' table size changes from commit to commit, so deltas cross table sizes.
    for (k, bins) in [8, 4, 16, 6].into_iter().enumerate() {
        mdl::config::set_config(
            &repo,
            "quant.exp_avg",
            &format!("bins={bins} prune=0 protect=0.0005 metric=magnitude domain=linear"),
        )
        .unwrap();
        model.steps(3);
        let file = dir.path().join(format!("c{k}.safetensors"));
        model.write(&file);
        let c = commit(
            &repo,
            &file,
            &lossy_opts(model.step, Some(policy)),
            &NoProgress,
        )
        .unwrap();
        assert!(c.lossy_tensors >= 5, "{}", c.lossy_tensors);
        let out = dir.path().join(format!("c{k}.out"));
        check_checkout(&repo, &c.id.to_string(), &file, &out);
        outs.push((c.id, std::fs::read(&out).unwrap()));
    }
    // Older commits decode to the same bytes after later commits re-encoded them.
    let (mut deltas, mut residuals) = (0, 0);
    for (id, bytes) in &outs {
        let out = dir.path().join("again");
        checkout_to(&repo, &id.to_string(), &out);
        assert_eq!(&std::fs::read(&out).unwrap(), bytes);
        let shown = mdl::show::show(&repo, &id.to_string()).unwrap();
        deltas += shown
            .tensors
            .iter()
            .filter(|t| t.codec == "quant-delta")
            .count();
        residuals += shown
            .tensors
            .iter()
            .filter(|t| t.codec == "quant-residual")
            .count();
        for t in &shown.tensors {
            assert!(t.depth <= 16);
        }
    }
    // Weights that moved a little are residuals from their previous version, and so are the
    // moments unless told otherwise: chains mix residual, quant-delta and lossless records.
    if moment_residuals {
        assert!(residuals >= 12, "only {residuals} quant-residual records");
    } else {
        assert!(deltas >= 6, "only {deltas} quant-delta records");
        assert!(residuals >= 2, "only {residuals} quant-residual records");
    }
    let report = mdl::fsck::fsck(&repo, false).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// A residual chain is decoded bottom up and hashed at its top only: a damaged record in the
/// middle still fails the read, by its own checksum, and names itself.
#[test]
fn a_damaged_record_inside_a_residual_chain_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(&dir.path().join("repo"));
    let policy = DeltaPolicy {
        mode: DeltaMode::Forward,
        max_depth: 16,
        max_restore_cost: None,
        defer: false,
    };
    let mut model = Model::new();
    let mut ids = Vec::new();
    for k in 0..3 {
        model.steps(3);
        let file = dir.path().join(format!("c{k}.safetensors"));
        model.write(&file);
        let opts = lossy_opts(model.step, Some(policy));
        ids.push(commit(&repo, &file, &opts, &NoProgress).unwrap().id);
    }
    let newest = ids[2].to_string();
    let shown = mdl::show::show(&repo, &newest).unwrap();
    let top = tensor(&shown, "model.a");
    assert_eq!(top.codec, "quant-residual");
    assert!(top.depth >= 2, "depth {}", top.depth);
    let middle = top.base.expect("a residual has a base");
    let out = dir.path().join("out.safetensors");
    let opts = CheckoutOptions::default();
    checkout(&repo, &newest, &out, &opts, &NoProgress).unwrap();
    let before = std::fs::read(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    let path = mdl::inspect::record_path(&repo, &middle).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    std::fs::write(&path, bytes).unwrap();
    // The newest commit's tensors are kept decoded (`.mdl/tips`), checked against their own
    // hashes: its checkout still gives its bytes. Without them the chain is decoded, and the
    // damaged record named.
    checkout(&repo, &newest, &out, &opts, &NoProgress).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), before);
    std::fs::remove_file(&out).unwrap();
    std::fs::remove_dir_all(dir.path().join("repo/.mdl/tips")).unwrap();
    let err = checkout(
        &repo,
        &newest,
        &out,
        &CheckoutOptions::default(),
        &NoProgress,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains(&middle.to_hex()), "{err}");
    assert!(!out.exists(), "no output after a failed checkout");
    let report = mdl::fsck::fsck(&repo, false).unwrap();
    assert!(report.problems.iter().any(|p| p.contains(&middle.to_hex())));
}

#[test]
fn reverse_quant_chains_decode_every_commit() {
    chain_with_table_changes(DeltaMode::Reverse, false);
    chain_with_table_changes(DeltaMode::Reverse, true);
}

#[test]
fn forward_quant_chains_decode_every_commit() {
    chain_with_table_changes(DeltaMode::Forward, false);
    chain_with_table_changes(DeltaMode::Forward, true);
}

#[test]
fn the_search_stays_within_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(&dir.path().join("repo"));
    let mut model = Model::new();
    for k in 0..2 {
        model.steps(5);
        let file = dir.path().join(format!("c{k}.safetensors"));
        model.write(&file);
        let c = commit(&repo, &file, &lossy_opts(model.step, None), &NoProgress).unwrap();
        let s = c.search.unwrap();
        assert_eq!(s.budget, 0.01 * 2.5);
        assert!(
            s.est_delta_loss <= s.budget,
            "{} > {}",
            s.est_delta_loss,
            s.budget
        );
        // The two matrices and the norm vector (no moments: searched by relative error). The
        // neighbourhood search follows a quantizer configuration; a tensor kept exact or
        // stored as a uniform or residual record is searched from the whole grid again.
        if k == 0 {
            assert_eq!((s.guided, s.neighbourhood), (3, 0));
        } else {
            assert_eq!(s.guided + s.neighbourhood, 3, "{s:?}");
        }
        // What the manifest records (measured on the reconstruction) agrees.
        let shown = mdl::show::show(&repo, &c.id.to_string()).unwrap();
        let recorded: f64 = shown
            .tensors
            .iter()
            .filter(|t| t.name.starts_with("model."))
            .filter_map(|t| t.lossy_info.as_ref()?.est_delta_loss)
            .sum();
        assert!(recorded > 0.0);
        assert!(
            recorded <= s.budget * (1.0 + 1e-6),
            "{recorded} > {}",
            s.budget
        );
        assert!((recorded - s.est_delta_loss).abs() <= 1e-6 * s.budget);
        for t in &shown.tensors {
            if let Some(l) = &t.lossy_info {
                assert!(l.settings.contains("sensitivity=moments") || t.name.starts_with("optim"));
            }
        }
    }
}

/// A mixed-precision checkpoint: `model.b` in bf16 beside its fp32 master copy, both paired
/// with one pair of moments (the default pairings).
#[test]
fn without_moments_the_bound_is_relative_error() {
    let (dir, repo, model, file) = one_checkpoint();
    let mut opts = lossy_opts(model.step, None);
    opts.lossy.epsilon = Some(0.05);
    opts.lossy.moments = Some("none.{}:none.{}.m:none.{}.v".into());
    let c = commit(&repo, &file, &opts, &NoProgress).unwrap();
    let shown = mdl::show::show(&repo, &c.id.to_string()).unwrap();
    let mut quantized = 0;
    for t in &shown.tensors {
        if let Some(l) = &t.lossy_info {
            quantized += 1;
            assert!(l.rel_error <= 0.05, "{}: {}", t.name, l.rel_error);
            assert!(
                l.settings.contains("sensitivity=magnitude"),
                "{}",
                l.settings
            );
            assert_eq!(l.est_delta_loss, None);
        }
    }
    assert!(quantized >= 2);
    check_checkout(&repo, "HEAD", &file, &dir.path().join("out"));
}

#[test]
fn mantissa_trim_keeps_its_bound() {
    let (dir, repo, _model, file) = one_checkpoint();
    let opts = CommitOptions {
        lossy: LossyRequest {
            mode: Some(CodecMode::Trim),
            trim_bits: Some(4),
            ..Default::default()
        },
        ..Default::default()
    };
    let c = commit(&repo, &file, &opts, &NoProgress).unwrap();
    assert!(c.lossy_tensors >= 6);
    let out = dir.path().join("out");
    check_checkout(&repo, "HEAD", &file, &out);
    let (orig, got) = (read_safetensors(&file), read_safetensors(&out));
    for (name, (d, _, ob)) in &orig {
        if !name.starts_with("optim.a") {
            continue;
        }
        let gb = &got[name].2;
        for i in 0..ob.len() / 4 {
            let (x, y) = (scalar::value(*d, ob, i), scalar::value(*d, gb, i));
            if x.abs() > 1e-30 {
                assert!(((y - x) / x).abs() <= 1.0 / 16.0, "{name}[{i}]: {x} → {y}");
            }
        }
    }
    let shown = mdl::show::show(&repo, "HEAD").unwrap();
    assert!(shown.tensors.iter().any(|t| t.codec == "mantissa-trim"));
}

#[test]
fn eval_command_scores_candidates_and_failures_change_nothing() {
    let (_dir, repo, mut model, file) = one_checkpoint();
    // A metric that does not depend on the file: the loosest candidate passes.
    let mut opts = lossy_opts(model.step, None);
    opts.lossy.eval_cmd = Some("test -s {} && echo loss 1.5".into());
    let c = commit(&repo, &file, &opts, &NoProgress).unwrap();
    let s = c.search.unwrap();
    assert_eq!(s.evaluations, 2);
    assert!(c.lossy_tensors >= 6);
    // A failing command is an error and leaves the branch where it was.
    model.steps(1);
    model.write(&file);
    opts.lossy.eval_cmd = Some("echo oops; exit 3".into());
    let err = commit(&repo, &file, &opts, &NoProgress).unwrap_err();
    assert!(err.to_string().contains("evaluation command"), "{err}");
    opts.lossy.eval_cmd = Some("echo no number here".into());
    assert!(commit(&repo, &file, &opts, &NoProgress).is_err());
    assert_eq!(mdl::log::log(&repo, None, None).unwrap().len(), 1);
    assert!(!repo.root().join(".mdl").read_dir().unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with("eval-")));
}

/// Largest absolute and relative L2 error of `got` against `orig` (little-endian `dtype`).
fn errors(dtype: Dtype, orig: &[u8], got: &[u8]) -> (f64, f64) {
    let (mut max, mut se, mut ss) = (0.0f64, 0.0f64, 0.0f64);
    for i in 0..orig.len() / dtype.size() {
        let (x, y) = (scalar::value(dtype, orig, i), scalar::value(dtype, got, i));
        max = max.max((y - x).abs());
        se += (y - x) * (y - x);
        ss += x * x;
    }
    (max, if ss > 0.0 { (se / ss).sqrt() } else { 0.0 })
}

#[test]
fn coarsening_older_moments_keeps_every_id_and_the_tip() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(&dir.path().join("repo"));
    let mut model = Model::new();
    let mut commits = Vec::new();
    for k in 0..5 {
        model.steps(3);
        let file = dir.path().join(format!("c{k}.safetensors"));
        model.write(&file);
        let c = commit(&repo, &file, &lossy_opts(model.step, None), &NoProgress).unwrap();
        let out = dir.path().join(format!("c{k}.out"));
        checkout_to(&repo, &c.id.to_string(), &out);
        commits.push((c.id, file, std::fs::read(&out).unwrap()));
    }
    let tip = commits.last().unwrap().0;
    let log_before = mdl::log::log(&repo, Some("main"), None).unwrap();
    let shown_before: Vec<_> = commits
        .iter()
        .map(|(id, ..)| mdl::show::show(&repo, &id.to_string()).unwrap())
        .collect();

    // A bad value is refused and changes nothing.
    assert!(mdl::config::set_config(&repo, mdl::coarsen::COARSEN_AFTER_KEY, "0").is_err());
    assert!(mdl::gc::gc(&repo, &Default::default(), &NoProgress)
        .unwrap()
        .coarsened
        .tensors
        .eq(&0));
    mdl::config::set_config(&repo, mdl::coarsen::COARSEN_AFTER_KEY, "2").unwrap();
    let dry = mdl::gc::gc(
        &repo,
        &mdl::gc::GcOptions {
            dry_run: true,
            ..Default::default()
        },
        &NoProgress,
    )
    .unwrap();
    let done = mdl::gc::gc(&repo, &Default::default(), &NoProgress).unwrap();
    let c = &done.coarsened;
    assert_eq!(c.tensors, dry.coarsened.tensors);
    assert!(c.tensors >= 3, "coarsened {}", c.tensors);
    assert!(c.bytes_after < c.bytes_before, "{c:?}");

    // Ids, history and refs as they were.
    assert_eq!(mdl::revision::resolve(&repo, "main").unwrap(), tip);
    let log_after = mdl::log::log(&repo, Some("main"), None).unwrap();
    let ids = |l: &[mdl::log::LogEntry]| l.iter().map(|e| e.id).collect::<Vec<_>>();
    assert_eq!(ids(&log_before), ids(&log_after));
    let report = mdl::fsck::fsck(&repo, false).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);

    let mut coarsened = 0;
    for (k, ((id, file, fine), before)) in commits.iter().zip(&shown_before).enumerate() {
        let out = dir.path().join("again");
        checkout_to(&repo, &id.to_string(), &out);
        let shown = mdl::show::show(&repo, &id.to_string()).unwrap();
        assert_eq!(shown.manifest, before.manifest);
        if k >= commits.len() - 2 {
            // The tip and the commit within reach of it: untouched, record for record.
            assert!(&std::fs::read(&out).unwrap() == fine, "commit {k} changed");
            for (a, b) in shown.tensors.iter().zip(&before.tensors) {
                assert_eq!((a.stored_bytes, a.base), (b.stored_bytes, b.base));
            }
            continue;
        }
        let was_path = dir.path().join("was");
        std::fs::write(&was_path, fine).unwrap();
        let (orig, got, was) = (
            read_safetensors(file),
            read_safetensors(&out),
            read_safetensors(&was_path),
        );
        for t in &shown.tensors {
            let (dtype, _, ob) = &orig[&t.name];
            let gb = &got[&t.name].2;
            let coarse = t.lossy_info.as_ref().is_some_and(|l| l.coarsened);
            if !coarse {
                assert!(
                    gb == &was[&t.name].2,
                    "{}: only coarsened tensors change",
                    t.name
                );
                continue;
            }
            assert!(t.name.ends_with(".exp_avg"), "{} coarsened", t.name);
            coarsened += 1;
            // The recorded errors bound the measured ones against the committed tensor.
            let l = t.lossy_info.as_ref().unwrap();
            let (max, rel) = errors(*dtype, ob, gb);
            assert!(
                max <= l.max_abs_error,
                "{}: {max} > {}",
                t.name,
                l.max_abs_error
            );
            assert!(
                rel <= l.rel_error * (1.0 + 1e-9),
                "{}: {rel} > {}",
                t.name,
                l.rel_error
            );
        }
    }
    assert_eq!(coarsened, c.tensors);

    // A second run finds nothing more to do.
    let again = mdl::gc::gc(&repo, &Default::default(), &NoProgress).unwrap();
    assert_eq!(again.coarsened.tensors, 0);

    // A new commit of a coarsened checkpoint's committed reconstruction names the coarsened
    // objects' ids: they get their committed content back, and everything still decodes.
    let is_coarse = |id: &mdl_format::ObjectId| {
        let shown = mdl::show::show(&repo, &id.to_string()).unwrap();
        shown
            .tensors
            .iter()
            .any(|t| t.lossy_info.as_ref().is_some_and(|l| l.coarsened))
    };
    let (first, _, fine) = commits.iter().find(|(id, ..)| is_coarse(id)).unwrap();
    let back = dir.path().join("fine.safetensors");
    std::fs::write(&back, fine).unwrap();
    let opts = CommitOptions {
        step: Some(1),
        ..Default::default()
    };
    let c = commit(&repo, &back, &opts, &NoProgress).unwrap();
    for rev in [c.id, *first] {
        let out = dir.path().join("restored");
        checkout_to(&repo, &rev.to_string(), &out);
        assert!(
            &std::fs::read(&out).unwrap() == fine,
            "{rev} decodes as committed"
        );
    }
    assert!(!is_coarse(first));
    for (id, _, fine) in &commits {
        let out = dir.path().join("others");
        checkout_to(&repo, &id.to_string(), &out);
        if !is_coarse(id) {
            assert!(
                &std::fs::read(&out).unwrap() == fine,
                "{id} decodes as committed"
            );
        }
    }
    let report = mdl::fsck::fsck(&repo, false).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// `quant.exp_avg_drop` / `quant.exp_avg_sq_hold`: small first moments come back as zero, the
/// second moments beside them within the hold of their committed values, the rest within
/// their steps, and every recorded error is the measured one.
#[test]
fn dropped_moments_record_their_error_and_hold_v_close() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(&dir.path().join("repo"));
    mdl::config::set_config(&repo, "quant.exp_avg_drop", "2").unwrap();
    mdl::config::set_config(&repo, "quant.exp_avg_sq_hold", "1").unwrap();
    assert!(mdl::config::set_config(&repo, "quant.exp_avg_drop", "-1").is_err());
    assert!(mdl::config::set_config(&repo, "quant.exp_avg_sq_hold", "x").is_err());
    let mut model = Model::new();
    let (mut dropped, mut held) = (0usize, 0usize);
    // `exp_avg_sq` is a log residual one octave a step: within half an octave unless held.
    let half_step = 0.5;
    for k in 0..2 {
        model.steps(3);
        let file = dir.path().join(format!("c{k}.safetensors"));
        model.write(&file);
        let c = commit(&repo, &file, &lossy_opts(model.step, None), &NoProgress).unwrap();
        let out = dir.path().join(format!("c{k}.out"));
        check_checkout(&repo, &c.id.to_string(), &file, &out);
        if k == 0 {
            continue; // No previous version: the moments' quantizer, nothing dropped.
        }
        let (orig, got) = (read_safetensors(&file), read_safetensors(&out));
        for (name, (dtype, _, m)) in &orig {
            let Some(base) = name.strip_suffix(".exp_avg") else {
                continue;
            };
            let v = &orig[&format!("{base}.exp_avg_sq")].2;
            let (m_got, v_got) = (&got[name].2, &got[&format!("{base}.exp_avg_sq")].2);
            if m_got == m {
                continue; // Too small to be lossy.
            }
            let value = |b: &[u8], i: usize| scalar::value(*dtype, b, i);
            let n = m.len() / dtype.size();
            let mean = (0..n).map(|i| value(m, i).abs()).sum::<f64>() / n as f64;
            for i in 0..n {
                let octaves = (value(v_got, i) / value(v, i)).log2().abs();
                if value(m, i).abs() <= 2.0 * mean {
                    assert_eq!(value(m_got, i), 0.0, "{name}[{i}] kept");
                    dropped += 1;
                    assert!(
                        octaves <= 1.0 + 1e-6,
                        "{name}[{i}]: v off by {octaves} octaves"
                    );
                    held += usize::from(octaves > half_step + 1e-6);
                } else {
                    assert!(
                        octaves <= half_step + 1e-6,
                        "{name}[{i}]: v off by {octaves} octaves"
                    );
                }
            }
        }
    }
    assert!(dropped > 1000, "only {dropped} first moments dropped");
    assert!(held > 0, "no second moment was held beyond its step");
}
