//! Weights coded with a step per row and column (`quant.row_col_steps`, format 14): the steps
//! follow the second moment, the recorded errors are the checkout's, and the switch turns them
//! off.

use mdl::commit::commit;
use mdl::NoProgress;
use mdl_codec::scalar;
use mdl_format::Dtype;

use super::common::read_safetensors;
use super::{check_checkout, init_repo, lossy_opts, tensor, Model};

/// Mean absolute error of `model.a`'s rows `rows` in a checkout against the original.
fn row_error(orig: &[u8], got: &[u8], rows: std::ops::Range<usize>) -> f64 {
    let cols = 256;
    let (mut sum, mut n) = (0.0, 0);
    for i in rows.start * cols..rows.end * cols {
        let (x, y) = (
            scalar::value(Dtype::F32, orig, i),
            scalar::value(Dtype::F32, got, i),
        );
        sum += (y - x).abs();
        n += 1;
    }
    sum / n as f64
}

#[test]
fn steps_follow_the_second_moment_and_record_what_checks_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    model.steps(3);
    // The first half of `a`'s rows sees gradients a hundred times the second half's (rare
    // tokens' rows of an embedding do, the other way round).
    let v = model.v.get_mut("a").unwrap();
    for x in &mut v[..128 * 256] {
        *x *= 1e4;
    }
    let base = dir.path().join("0.safetensors");
    model.write(&base);
    model.steps(2);
    let file = dir.path().join("1.safetensors");
    model.write(&file);
    let mut settings = Vec::new();
    for on in [true, false] {
        let repo = init_repo(&dir.path().join(format!("repo-{on}")));
        let switch = if on { "on" } else { "off" };
        mdl::config::set_config(&repo, "quant.row_col_steps", switch).unwrap();
        for (step, f) in [(3, &base), (5, &file)] {
            commit(&repo, f, &lossy_opts(step, None), &NoProgress).unwrap();
        }
        let out = dir.path().join(format!("out-{on}.safetensors"));
        // Every recorded error is the checkout's, to the bit.
        check_checkout(&repo, "HEAD", &file, &out);
        let shown = mdl::show::show(&repo, "HEAD").unwrap();
        let a = tensor(&shown, "model.a");
        let l = a.lossy_info.as_ref().expect("model.a is lossy");
        settings.push(l.settings.clone());
        if on {
            // The sensitive rows were coded finer than the others.
            let orig = &read_safetensors(&file)["model.a"].2;
            let got = &read_safetensors(&out)["model.a"].2;
            let (fine, coarse) = (row_error(orig, got, 0..128), row_error(orig, got, 128..256));
            assert!(fine * 4.0 < coarse, "{fine} vs {coarse}: {}", l.settings);
        }
        // A 1-D tensor keeps one step.
        let ln = tensor(&shown, "model.ln");
        if let Some(l) = &ln.lossy_info {
            assert!(!l.settings.contains("steps="), "{}", l.settings);
        }
    }
    assert!(settings[0].contains("steps=rows-cols"), "{}", settings[0]);
    assert!(!settings[1].contains("steps="), "{}", settings[1]);
}
