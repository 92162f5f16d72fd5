//! The full training curve a checkpoint carries: a `transformers` Trainer writes every logged
//! value (loss, learning rate, gradient norm, evaluation metrics) into `trainer_state.json`'s
//! `log_history`, far more points than one per saved checkpoint. The repository page charts
//! those of the newest checkpoint of HEAD's branch.

use mdl::refs::RefInfo;
use mdl::Repository;
use serde_json::Value;

use super::{card, commit_href, short};
use crate::web::chart::{self, Point, Series};

/// The steps the charts show: `from..=to`, either end open.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Steps {
    pub from: Option<u64>,
    pub to: Option<u64>,
}

impl Steps {
    pub(crate) fn holds(&self, step: f64) -> bool {
        self.from.is_none_or(|f| step >= f as f64) && self.to.is_none_or(|t| step <= t as f64)
    }
}

/// Values charted at most.
const MAX_CURVES: usize = 8;

/// Charts of `head`'s checkpoint's `log_history` within `steps` (one a logged value, in order
/// of first appearance), and a line saying where they come from; nothing when the checkpoint
/// has no readable `trainer_state.json`.
pub(crate) fn training_curves(
    repo: &Repository,
    name: &str,
    head: &RefInfo,
    steps: Steps,
) -> mdl::Result<(Vec<String>, String)> {
    let id = head.target.to_hex();
    let listed = crate::budgeted::hold(repo, &id, crate::budgeted::LISTED, |c| {
        mdl::checkout::listing(repo, &c.to_hex())
    })?;
    let Some(path) = listed
        .files
        .iter()
        .map(|f| f.path.as_str())
        .filter(|p| *p == "trainer_state.json" || p.ends_with("/trainer_state.json"))
        .min_by_key(|p| p.len())
    else {
        return Ok((Vec::new(), String::new()));
    };
    let Some(text) = card::small_text(repo, &listed, path) else {
        return Ok((Vec::new(), String::new()));
    };
    let series = log_history(&text, steps);
    let href = commit_href(name, &id);
    let charts = series
        .into_iter()
        .take(MAX_CURVES)
        .filter_map(|(key, points)| {
            let points = points
                .into_iter()
                .map(|(step, v)| Point {
                    x: step,
                    y: v,
                    marked: false,
                    href: href.clone(),
                    label: format!("step {step}: {key}={v}"),
                })
                .collect();
            let svg = chart::lines(&key, "step", &[Series { name: key.clone(), points }])?;
            Some(format!(
                r#"<figure class="metric curve" data-metric="{}"><figcaption>{}</figcaption>{svg}</figure>"#,
                chart::esc(&key),
                chart::esc(&key)
            ))
        })
        .collect::<Vec<_>>();
    let source = if charts.is_empty() {
        String::new()
    } else {
        format!("{path} of {} ({})", head.name, short(&head.target))
    };
    Ok((charts, source))
}

/// Each numeric value of `log_history` (but the step and epoch) as `(step, value)` points
/// within `steps`, values in order of first appearance.
fn log_history(text: &str, steps: Steps) -> Vec<(String, Vec<(f64, f64)>)> {
    let Ok(state) = serde_json::from_str::<Value>(text) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for entry in state["log_history"].as_array().into_iter().flatten() {
        let Some(step) = entry.get("step").and_then(Value::as_f64) else {
            continue;
        };
        if !steps.holds(step) {
            continue;
        }
        for (key, value) in entry.as_object().into_iter().flatten() {
            let Some(v) = value.as_f64().filter(|v| v.is_finite()) else {
                continue;
            };
            if key == "step" || key == "epoch" {
                continue;
            }
            match out.iter_mut().find(|(k, _)| k == key) {
                Some((_, points)) => points.push((step, v)),
                None => out.push((key.clone(), vec![(step, v)])),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_logged_value_is_a_curve_within_the_steps() {
        let text = r#"{"global_step": 30, "log_history": [
            {"epoch": 0.1, "step": 10, "loss": 2.5, "learning_rate": 1e-4, "grad_norm": 3.0},
            {"epoch": 0.2, "step": 20, "loss": 2.1, "learning_rate": 9e-5},
            {"epoch": 0.2, "step": 20, "eval_loss": 2.3},
            {"epoch": 0.3, "step": 30, "loss": 1.9, "learning_rate": 8e-5, "note": "text"}
        ]}"#;
        let all = log_history(text, Steps::default());
        let names: Vec<&str> = all.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["grad_norm", "learning_rate", "loss", "eval_loss"]);
        assert_eq!(all[2].1, [(10.0, 2.5), (20.0, 2.1), (30.0, 1.9)]);
        let zoomed = log_history(
            text,
            Steps {
                from: Some(15),
                to: Some(25),
            },
        );
        assert_eq!(
            zoomed.iter().find(|(k, _)| k == "loss").unwrap().1,
            [(20.0, 2.1)]
        );
        assert!(log_history("not json", Steps::default()).is_empty());
    }
}
