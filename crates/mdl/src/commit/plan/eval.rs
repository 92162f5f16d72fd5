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
/// `None`) or a copy with the planned tensors replaced by their reconstructions, and the 16-bit
/// copies of those of them that are masters (`casts`) by what the commit would store: the
/// cast of the reconstruction, so the command scores what a resumed run would use whichever
/// copy it reads.
pub(super) fn evaluate_candidate(
    repo: &Repository,
    input: &Input,
    engine: &dyn Engine,
    correction: Correction,
    settings: &LossySettings,
    casts: &[Option<usize>],
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
    // A master's reconstruction is made once, for itself and its copy.
    let masters = std::cell::RefCell::new(std::collections::HashMap::new());
    let render_master = |j: usize| -> Option<Vec<u8>> {
        if let Some(r) = masters.borrow().get(&j) {
            return Some(Vec::clone(r));
        }
        let r = render(j)?;
        masters.borrow_mut().insert(j, r.clone());
        Some(r)
    };
    // A copy follows its master's reconstruction (`mdl_codec::cast::follow`).
    let render_any = |i: usize| -> Option<Vec<u8>> {
        if casts.contains(&Some(i)) {
            return render_master(i);
        }
        let Some(j) = casts.get(i).copied().flatten() else {
            return render(i);
        };
        let recon = render_master(j)?;
        let mut out = vec![0u8; input.pieces[i].len as usize];
        let dtype = input.pieces[i].header.dtype;
        mdl_codec::cast::follow(dtype, input.tensor(j), &recon, input.tensor(i), &mut out);
        Some(out)
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
                if let Some(bytes) = render_any(i) {
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
