//! What a checkpoint says of itself: the step and the metrics of that step, from a Hugging
//! Face Trainer's `trainer_state.json`, else from safetensors metadata; and the optimizer's
//! Adam betas, from whichever file of the tree records them.

use mdl_format::FileFormat;

use super::Input;

/// The file Trainer writes its state to, in each `checkpoint-N/` folder.
const TRAINER_STATE: &str = "trainer_state.json";

/// The file a commit of live Python state records its structure in (`python/mdl/_state.py`).
const STATE_FILE: &str = "mdl-state.json";

/// Metric names taken from safetensors `__metadata__` (there every value is a string, and
/// most are not metrics).
const METADATA_METRICS: [&str; 4] = ["loss", "val_loss", "train_loss", "eval_loss"];

impl Input {
    /// The training step the checkpoint records: the shallowest `trainer_state.json`'s
    /// `global_step`, else a safetensors file's `step` metadata.
    pub(crate) fn recorded_step(&self) -> Option<u64> {
        self.trainer_state()
            .and_then(|s| s.get("global_step")?.as_u64())
            .or_else(|| self.metadata_value("step"))
    }

    /// The metrics the checkpoint records for its step: every number of the
    /// `trainer_state.json` log entries at `global_step` (training loss, learning rate, eval
    /// metrics; not the step itself), else the loss values of safetensors metadata. Sorted by
    /// name; a later entry's value wins.
    pub(crate) fn recorded_metrics(&self) -> Vec<(String, f64)> {
        let mut out = std::collections::BTreeMap::new();
        if let Some(state) = self.trainer_state() {
            let step = state.get("global_step").and_then(|s| s.as_u64());
            let log = state.get("log_history").and_then(|l| l.as_array());
            for entry in log.into_iter().flatten().filter_map(|e| e.as_object()) {
                if entry.get("step").and_then(|s| s.as_u64()) != step || step.is_none() {
                    continue;
                }
                for (k, v) in entry {
                    if let Some(x) = v.as_f64().filter(|x| x.is_finite()) {
                        if k != "step" && !k.is_empty() && !k.contains('=') {
                            out.insert(k.clone(), x);
                        }
                    }
                }
            }
        } else {
            for name in METADATA_METRICS {
                if let Some(x) = self.metadata_value::<f64>(name).filter(|x| x.is_finite()) {
                    out.insert(name.to_string(), x);
                }
            }
        }
        out.into_iter().collect()
    }

    /// Adam's `(β1, β2)` as the checkpoint records them, and the tree path of the file that
    /// does: a torch archive's optimizer `param_groups` or `TrainingArguments`
    /// (`optimizer.pt`, `training_args.bin`, a Lightning `.ckpt`), the `param_groups` of a
    /// live state commit's `mdl-state.json`, or safetensors metadata (`adam_betas` or `betas`
    /// as `"B1,B2"`, or `adam_beta1` with `adam_beta2`). The first file in tree order that
    /// records them; within a file, the largest of each where groups differ.
    pub(crate) fn recorded_betas(&self) -> Option<((f64, f64), String)> {
        self.files.iter().find_map(|f| {
            let name = f.tree_path.rsplit('/').next().unwrap_or_default();
            let betas = if name == STATE_FILE {
                serde_json::from_slice(f.head())
                    .ok()
                    .and_then(|v| json_betas(&v))
            } else if f.format == FileFormat::Torch || mdl_format::torch::looks_like_zip(f.head()) {
                mdl_format::torch::adam_betas(f.head()).ok().flatten()
            } else {
                metadata_betas(&f.metadata)
            };
            betas.map(|b| (b, f.tree_path.clone()))
        })
    }

    /// The shallowest `trainer_state.json` of the tree (the first by path among equals),
    /// parsed; `None` when there is none or it is not a JSON object.
    fn trainer_state(&self) -> Option<serde_json::Map<String, serde_json::Value>> {
        let file = self
            .files
            .iter()
            .filter(|f| f.tree_path.rsplit('/').next() == Some(TRAINER_STATE))
            .min_by_key(|f| f.tree_path.matches('/').count())?;
        match serde_json::from_slice(file.head()) {
            Ok(serde_json::Value::Object(m)) => Some(m),
            _ => None,
        }
    }
}

/// A beta: a number in `[0, 1)`.
fn beta(x: f64) -> Option<f64> {
    (0.0..1.0).contains(&x).then_some(x)
}

/// Betas in safetensors metadata, where every value is a string.
fn metadata_betas(metadata: &[(String, String)]) -> Option<(f64, f64)> {
    let get = |key: &str| {
        metadata
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.trim())
    };
    let one = |v: &str| v.parse::<f64>().ok().and_then(beta);
    if let Some(v) = get("adam_betas").or_else(|| get("betas")) {
        // "0.9,0.95", "(0.9, 0.95)" or "[0.9, 0.95]"
        let inner = v.trim_matches(|c| matches!(c, '(' | ')' | '[' | ']'));
        let (a, b) = inner.split_once(',')?;
        return one(a.trim()).zip(one(b.trim()));
    }
    get("adam_beta1")
        .and_then(one)
        .zip(get("adam_beta2").and_then(one))
}

/// Betas anywhere in a live state's JSON: objects with `"betas": [B1, B2]` (a tuple is
/// `{"$tuple": [...]}` there); the largest of each where groups differ.
fn json_betas(v: &serde_json::Value) -> Option<(f64, f64)> {
    use serde_json::Value;
    let pair = |b: &Value| {
        let b = b.get("$tuple").unwrap_or(b).as_array()?;
        match b.as_slice() {
            [x, y] => x.as_f64().and_then(beta).zip(y.as_f64().and_then(beta)),
            _ => None,
        }
    };
    let mut found: Option<(f64, f64)> = None;
    let mut todo = vec![v];
    while let Some(v) = todo.pop() {
        match v {
            Value::Object(m) => {
                if let Some((b1, b2)) = m.get("betas").and_then(pair) {
                    found = Some(found.map_or((b1, b2), |(a1, a2)| (a1.max(b1), a2.max(b2))));
                }
                todo.extend(m.values());
            }
            Value::Array(a) => todo.extend(a),
            _ => {}
        }
    }
    found
}
