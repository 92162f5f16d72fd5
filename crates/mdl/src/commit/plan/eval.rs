//! Scoring a lossy candidate with `--eval-cmd`: the committed checkpoint with the planned
//! tensors replaced by their reconstructions, in a scratch file (a single-file commit) or a
//! scratch folder (a tree) that the command reads.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use mdl_format::ObjectId;
use mdl_store::Store;

use mdl_codec::engine::Engine;
use mdl_codec::quant::Correction;

use crate::input::{Input, Run};
use crate::lossy::{LossySettings, Reference, TensorPlan};
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
    let candidate = Candidate {
        input,
        engine,
        correction,
        plans,
        followed: (casts.iter().flatten().copied())
            .chain(
                plans
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter_map(TensorPlan::follows),
            )
            .collect(),
        made: Default::default(),
    };
    // A copy follows its master's reconstruction (`mdl_codec::cast::follow`).
    let render_any = |i: usize| -> Option<Vec<u8>> {
        let Some(j) = casts.get(i).copied().flatten() else {
            return candidate.reconstruction(i);
        };
        let recon = candidate.shared(j)?;
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

/// The planned tensors of a candidate, reconstructed.
struct Candidate<'a> {
    input: &'a Input,
    engine: &'a dyn Engine,
    correction: Correction,
    plans: Option<&'a [Option<TensorPlan>]>,
    /// The pieces other pieces follow: a copy's master, a first moment's second moment.
    followed: HashSet<usize>,
    /// Reconstructions other tensors follow (a master's, a second moment's), made once.
    made: RefCell<HashMap<usize, Arc<Vec<u8>>>>,
}

impl Candidate<'_> {
    /// Piece `i`'s reconstruction under its plan (`None`: not planned). A plan that follows
    /// another piece takes that piece's reconstruction as its reference, as the store does
    /// (where the store finds that piece at the depth cap it takes the previous commit's unit,
    /// or the quantizer, instead: the candidate scored differs there in the optimizer state
    /// only).
    fn render(&self, i: usize) -> Option<Vec<u8>> {
        let plan = self.plans?.get(i)?.as_ref()?;
        let followed = plan.follows().map(|j| {
            let content = self
                .shared(j)
                .unwrap_or_else(|| Arc::new(self.input.tensor(j).to_vec()));
            plan.follow(Some(Reference {
                id: ObjectId::from_bytes([0; 32]),
                depth: 0,
                content,
            }))
        });
        let plan = followed.as_ref().unwrap_or(plan);
        let q = lossy::quantize(
            self.engine,
            self.input.view(i),
            self.input.moments(plan.moments),
            plan.first_moment().map(|m| self.input.view(m)),
            plan,
            self.correction,
        );
        Some(q.render)
    }

    /// Piece `i`'s reconstruction, made once where other pieces follow it.
    fn reconstruction(&self, i: usize) -> Option<Vec<u8>> {
        match self.followed.contains(&i) {
            true => self.shared(i).map(|r| Vec::clone(&r)),
            false => self.render(i),
        }
    }

    /// [`Self::render`] of a piece other pieces follow, made once.
    fn shared(&self, j: usize) -> Option<Arc<Vec<u8>>> {
        if let Some(r) = self.made.borrow().get(&j) {
            return Some(r.clone());
        }
        let r = Arc::new(self.render(j)?);
        self.made.borrow_mut().insert(j, r.clone());
        Some(r)
    }
}
