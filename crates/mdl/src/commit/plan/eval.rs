//! Scoring a lossy candidate with `--eval-cmd`: the committed checkpoint with the planned
//! tensors replaced by their reconstructions, in a scratch file (a single-file commit) or a
//! scratch folder (a tree) that the command reads.

use std::os::unix::fs::FileExt;

use mdl_store::Store;

use std::path::Path;

use mdl_codec::engine::Engine;
use mdl_codec::quant::Correction;

use crate::input::{Input, Run};
use crate::lossy::{LossySettings, TensorPlan};
use crate::{lossy, Error, Repository, Result};

/// Scores a candidate with the user's `--eval-cmd`: the committed checkpoint itself (`plans` =
/// `None`) or a copy with the planned tensors replaced by their reconstructions.
pub(super) fn evaluate_candidate(
    repo: &Repository,
    input: &Input,
    engine: &dyn Engine,
    correction: Correction,
    settings: &LossySettings,
    plans: Option<&[Option<TensorPlan>]>,
) -> Result<f64> {
    let cmd = settings.eval_cmd.as_deref().unwrap_or_default();
    if let (None, Some(path)) = (plans, input.single_file()) {
        return lossy::run_eval(cmd, path);
    }
    let store = repo.store();
    let render = |i: usize| -> Option<Vec<u8>> {
        let plan = plans?.get(i)?.as_ref()?;
        let q = lossy::quantize(
            engine,
            input.view(i),
            input.moments(plan.moments),
            plan.first_moment().map(|m| input.view(m)),
            plan,
            correction,
        );
        Some(q.render)
    };
    // Each file copied, then its planned tensors overwritten at their offsets.
    let write = |file: &std::fs::File, index: usize, path: &Path| -> Result<()> {
        let out_err = |source| Error::Output {
            path: path.to_path_buf(),
            source,
        };
        let f = &input.files[index];
        for (at, part) in f.parts() {
            file.write_all_at(part, at).map_err(out_err)?;
        }
        for run in &f.runs {
            if let Run::Object(i) = *run {
                if let Some(bytes) = render(i) {
                    file.write_all_at(&bytes, input.pieces[i].offset)
                        .map_err(out_err)?;
                }
            }
        }
        Ok(())
    };
    if input.single_file().is_some() {
        let tmp = store.scratch_file("eval-", ".safetensors")?;
        let _interrupted = crate::interrupt::register(tmp.path());
        write(tmp.as_file(), 0, tmp.path())?;
        return lossy::run_eval(cmd, tmp.path());
    }
    let dir = store.scratch_dir("eval-")?;
    let _interrupted = crate::interrupt::register(dir.path());
    for (index, f) in input.files.iter().enumerate() {
        let file = Store::scratch_dir_file(dir.path(), &f.tree_path)?;
        write(&file, index, &dir.path().join(&f.tree_path))?;
    }
    lossy::run_eval(cmd, dir.path())
}
