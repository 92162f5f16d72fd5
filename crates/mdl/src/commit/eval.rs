//! Scoring a lossy candidate with `--eval-cmd`: the committed file with the planned tensors
//! replaced by their reconstructions, in a scratch file the command reads.

use super::*;

/// Scores a candidate with the user's `--eval-cmd`: the committed file itself (`plans` =
/// `None`) or a copy with the planned tensors replaced by their reconstructions.
pub(super) fn evaluate_candidate(
    repo: &Repository,
    path: &Path,
    input: &Input,
    engine: &dyn Engine,
    correction: Correction,
    settings: &LossySettings,
    plans: Option<&[Option<TensorPlan>]>,
) -> Result<f64> {
    let cmd = settings.eval_cmd.as_deref().unwrap_or_default();
    let Some(plans) = plans else {
        return lossy::run_eval(cmd, path);
    };
    // The candidate: the committed file with the planned tensors replaced by their
    // reconstructions, in a temporary file removed when this returns.
    let tmp = repo.store().scratch_file("eval-", ".safetensors")?;
    let out_err = |source| Error::Output {
        path: tmp.path().to_path_buf(),
        source,
    };
    let _interrupted = crate::interrupt::register(tmp.path());
    {
        use std::io::Write;
        let file = tmp.as_file();
        (&*file).write_all(input.bytes()).map_err(out_err)?;
        for (i, plan) in plans.iter().enumerate() {
            let Some(plan) = plan else { continue };
            let t = &input.layout.tensors[i];
            let q = lossy::quantize(
                engine,
                input.view(i),
                input.moments(plan.moments),
                plan,
                correction,
            );
            use std::os::unix::fs::FileExt;
            file.write_all_at(&q.render, input.layout.data_start() + t.offset)
                .map_err(out_err)?;
        }
    }
    lossy::run_eval(cmd, tmp.path())
}
