//! What a checkpoint says of itself: the step and the metrics of that step, from a Hugging
//! Face Trainer's `trainer_state.json`, else from safetensors metadata.

use super::Input;

/// The file Trainer writes its state to, in each `checkpoint-N/` folder.
const TRAINER_STATE: &str = "trainer_state.json";

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

    /// The shallowest `trainer_state.json` of the tree (the first by path among equals),
    /// parsed; `None` when there is none or it is not a JSON object.
    fn trainer_state(&self) -> Option<serde_json::Map<String, serde_json::Value>> {
        let file = self
            .files
            .iter()
            .filter(|f| f.tree_path.rsplit('/').next() == Some(TRAINER_STATE))
            .min_by_key(|f| f.tree_path.matches('/').count())?;
        match serde_json::from_slice(file.bytes()) {
            Ok(serde_json::Value::Object(m)) => Some(m),
            _ => None,
        }
    }
}
