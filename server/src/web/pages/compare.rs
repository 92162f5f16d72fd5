//! The compare page: two revisions, tensors ranked by relative change and grouped by layer.

use std::collections::BTreeMap;

use askama::Template;
use mdl::diff::{Change, FileChange};
use mdl::storage::human_size;
use mdl::Repository;

use super::{commit_href, compare_href, Pager, TENSOR_PAGE};

/// The layer a tensor belongs to: its name up to the first numbered part (`model.layers.3`),
/// else without its last part (`transformer.wte`), else itself.
pub(crate) fn layer_of(name: &str) -> &str {
    let mut end = 0;
    for part in name.split('.') {
        end += part.len();
        if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
            return &name[..end];
        }
        end += 1;
    }
    name.rsplit_once('.').map_or(name, |(head, _)| head)
}

/// A tensor that changed, ranked.
pub(crate) struct ChangeRow {
    pub layer: String,
    pub file: String,
    pub name: String,
    pub change: String,
    pub bar: u32,
}

/// A layer's changes together.
pub(crate) struct LayerRow {
    pub layer: String,
    pub changed: usize,
    pub tensors: usize,
    pub max: String,
    pub bar: u32,
}

/// Two revisions compared.
#[derive(Template)]
#[template(path = "compare.html")]
pub(crate) struct ComparePage {
    pub repo: String,
    pub a: String,
    pub b: String,
    pub a_href: String,
    pub b_href: String,
    pub summary: String,
    pub layers: Vec<LayerRow>,
    pub ranked: Vec<ChangeRow>,
    pub changed: usize,
    pub pager: Pager,
    pub added: Vec<(String, String)>,
    pub removed: Vec<(String, String)>,
    pub files: Vec<(String, &'static str, String)>,
}

/// Builds page `page` of the comparison of `a` with `b`.
pub(crate) fn compare_page(
    repo: &Repository,
    name: &str,
    a: &str,
    b: &str,
    page: usize,
) -> mdl::Result<ComparePage> {
    let a_id = mdl::revision::resolve(repo, a)?;
    let b_id = mdl::revision::resolve(repo, b)?;
    // The comparison walked: unchanged tensors are counted (in their layer too), the others
    // kept. Reserved as if every tensor were kept.
    let mut compared = mdl::diff::compare(repo, &a_id, &b_id, mdl::diff::MANIFEST_COST)?;
    let files = compared.files()?;
    let (mut changed, mut added, mut removed, mut unchanged) = (Vec::new(), vec![], vec![], 0);
    let mut layers: BTreeMap<String, (usize, usize, Option<f64>)> = BTreeMap::new();
    compared.tensors(repo, |t| {
        let l = match layers.get_mut(layer_of(&t.name)) {
            Some(l) => l,
            None => layers.entry(layer_of(&t.name).to_string()).or_default(),
        };
        l.1 += 1;
        match t.change {
            Change::Changed { rel_l2, .. } => {
                l.0 += 1;
                if let Some(r) = rel_l2.filter(|r| r.is_finite()) {
                    l.2 = Some(l.2.map_or(r, |m: f64| m.max(r)));
                }
                changed.push((t.file, t.name, rel_l2));
            }
            Change::Added => added.push((t.file, t.name)),
            Change::Removed => removed.push((t.file, t.name)),
            Change::Unchanged => unchanged += 1,
        }
        Ok(())
    })?;
    // Largest relative change first; changes without a measure (reshaped, not floats) after.
    changed.sort_by(|x, y| {
        let key = |v: Option<f64>| v.filter(|v| v.is_finite()).unwrap_or(f64::NEG_INFINITY);
        key(y.2).total_cmp(&key(x.2))
    });
    let top = changed
        .iter()
        .filter_map(|(_, _, r)| *r)
        .filter(|r| r.is_finite())
        .fold(0.0f64, f64::max);
    let bar = |r: Option<f64>| match r {
        Some(r) if top > 0.0 && r.is_finite() => {
            ((r / top) * 100.0).round().clamp(1.0, 100.0) as u32
        }
        _ => 0,
    };
    let text = |r: Option<f64>| match r {
        Some(r) => format!("{r:.3e}"),
        None => "changed (no measure)".to_string(),
    };

    let mut layers: Vec<LayerRow> = layers
        .into_iter()
        .filter(|(_, (c, _, _))| *c > 0)
        .map(|(layer, (changed, tensors, max))| LayerRow {
            layer,
            changed,
            tensors,
            max: max.map_or_else(|| "—".to_string(), |m| format!("{m:.3e}")),
            bar: bar(max),
        })
        .collect();
    layers.sort_by(|x, y| y.bar.cmp(&x.bar).then(x.layer.cmp(&y.layer)));

    let link = |n| format!("{}&page={n}", compare_href(name, a, b));
    let pager = Pager::new(page, changed.len(), TENSOR_PAGE, link);
    let ranked = changed[pager.range(changed.len(), TENSOR_PAGE)]
        .iter()
        .map(|(file, name, r)| ChangeRow {
            layer: layer_of(name).to_string(),
            file: file.clone(),
            name: name.clone(),
            change: text(*r),
            bar: bar(*r),
        })
        .collect();
    let files = files
        .into_iter()
        .filter(|f| f.change != FileChange::Unchanged)
        .map(|f| {
            let what = match f.change {
                FileChange::Added => "added",
                FileChange::Removed => "removed",
                _ => "changed",
            };
            let size = match (f.bytes_a, f.bytes_b) {
                (Some(x), Some(y)) if x != y => format!("{} → {}", human_size(x), human_size(y)),
                (_, Some(y)) => human_size(y),
                (Some(x), None) => human_size(x),
                (None, None) => String::new(),
            };
            (f.path, what, size)
        })
        .collect();
    Ok(ComparePage {
        repo: name.to_string(),
        a_href: commit_href(name, &a_id.to_string()),
        b_href: commit_href(name, &b_id.to_string()),
        a: a.to_string(),
        b: b.to_string(),
        summary: format!(
            "{} changed, {} added, {} removed, {} unchanged",
            changed.len(),
            added.len(),
            removed.len(),
            unchanged
        ),
        changed: changed.len(),
        layers,
        ranked,
        pager,
        added,
        removed,
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_are_named_by_their_number_or_their_module() {
        assert_eq!(
            layer_of("model.layers.3.self_attn.q_proj.weight"),
            "model.layers.3"
        );
        assert_eq!(layer_of("transformer.wte.weight"), "transformer.wte");
        assert_eq!(layer_of("state.12.exp_avg"), "state.12");
        assert_eq!(layer_of("bias"), "bias");
    }
}
