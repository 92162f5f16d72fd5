//! First moments in units of a second moment: each commit codes a first moment against its own
//! second moment as stored, a series' first commit included; where that second moment is at
//! the depth cap, against the previous commit's; with neither, the quantizer.

use mdl::commit::commit;
use mdl::policy::DeltaPolicy;
use mdl::NoProgress;
use mdl_codec::scalar;
use mdl_format::Dtype;

use super::common::read_safetensors;
use super::{check_checkout, init_repo, lossy_opts, tensor, Model};

#[test]
fn first_moments_are_in_units_of_their_commits_second_moments() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(&dir.path().join("repo"));
    let mut model = Model::new();
    let mut bases = Vec::new();
    for (k, steps) in [3, 4].into_iter().enumerate() {
        model.steps(steps);
        let file = dir.path().join(format!("{k}.safetensors"));
        model.write(&file);
        commit(&repo, &file, &lossy_opts(model.step, None), &NoProgress).unwrap();
        // Every recorded error is the checkout's, to the bit.
        let out = dir.path().join(format!("out-{k}.safetensors"));
        check_checkout(&repo, "HEAD", &file, &out);
        let shown = mdl::show::show(&repo, "HEAD").unwrap();
        let m = tensor(&shown, "optim.a.exp_avg");
        let settings = &m.lossy_info.as_ref().expect("exp_avg is lossy").settings;
        assert_eq!(m.codec, "quant-residual", "{settings}");
        assert!(
            settings.starts_with("residual mode=scaled step=5e-1"),
            "{settings}"
        );
        bases.push(m.base.expect("a residual has a base"));
        // Within half a step of the unit the checkout's own second moment gives.
        let (orig, got) = (read_safetensors(&file), read_safetensors(&out));
        let v = &got["optim.a.exp_avg_sq"].2;
        let (orig, got) = (&orig["optim.a.exp_avg"].2, &got["optim.a.exp_avg"].2);
        for i in 0..orig.len() / 4 {
            let (x, y) = (
                scalar::value(Dtype::F32, orig, i),
                scalar::value(Dtype::F32, got, i),
            );
            let half = 0.25 * scalar::value(Dtype::F32, v, i).sqrt();
            assert!(
                (y - x).abs() <= half * (1.0 + 1e-6) + 1e-30,
                "element {i}: {x} → {y}"
            );
        }
    }
    // Each commit's base is its own second moment.
    let first = mdl::show::show(&repo, "HEAD~1").unwrap();
    let second = mdl::show::show(&repo, "HEAD").unwrap();
    let v = [&first, &second].map(|s| tensor(s, "optim.a.exp_avg_sq").id);
    assert_ne!(v[0], v[1]);
    assert_eq!(bases, v);
    let report = mdl::fsck::fsck(&repo, false).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

#[test]
fn at_the_depth_cap_a_first_moment_takes_the_previous_unit_or_the_quantizer() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    let mut files = Vec::new();
    for k in 0..2 {
        model.steps(3);
        let file = dir.path().join(format!("{k}.safetensors"));
        model.write(&file);
        files.push((model.step, file));
    }
    for cap in [0, 1] {
        let repo = init_repo(&dir.path().join(format!("repo-{cap}")));
        let policy = DeltaPolicy {
            max_depth: cap,
            ..Default::default()
        };
        for (k, (step, file)) in files.iter().enumerate() {
            commit(&repo, file, &lossy_opts(*step, Some(policy)), &NoProgress).unwrap();
            let out = dir.path().join(format!("out-{cap}-{k}.safetensors"));
            check_checkout(&repo, "HEAD", file, &out);
        }
        let (first, second) = (
            mdl::show::show(&repo, "HEAD~1").unwrap(),
            mdl::show::show(&repo, "HEAD").unwrap(),
        );
        let (m0, m1) = (
            tensor(&first, "optim.a.exp_avg"),
            tensor(&second, "optim.a.exp_avg"),
        );
        let v0 = tensor(&first, "optim.a.exp_avg_sq");
        let v1 = tensor(&second, "optim.a.exp_avg_sq");
        for m in [m0, m1] {
            assert!(m.depth <= cap, "{} at depth {} over {cap}", m.name, m.depth);
        }
        if cap == 0 {
            // No record may have a base: the quantizer, as without any second moment.
            assert_eq!(
                (m0.codec.as_str(), m1.codec.as_str()),
                ("quant-base", "quant-base")
            );
        } else {
            // The first commit's second moment is at depth 0, the second's at the cap: its
            // first moment takes the previous one's unit.
            assert_eq!((v0.depth, v1.depth), (0, 1));
            assert_eq!(m0.base, Some(v0.id));
            assert_eq!(m1.base, Some(v0.id));
        }
    }
}
