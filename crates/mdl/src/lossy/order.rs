//! Pairing parameters with their Adam moments by the optimizer's parameter order, for
//! checkpoints whose moments sit in a `torch.save` optimizer (`state.K.exp_avg`) rather than
//! under names that say whose they are.
//!
//! An optimizer's state is indexed by each parameter's position in the optimizer's groups
//! (`named_parameters` order, split by weight decay), which the checkpoint does not record.
//! What it does record is each moment's shape. A parameter is paired only where that is
//! forced: all the checkpoint's parameters of its shape belong to one *class* (names equal
//! once digit runs are ignored, as `h.0.mlp.c_fc.weight` and `h.11.mlp.c_fc.weight`), there are
//! as many of them as optimizer slots of that shape, and so the class's members, in the order
//! of their layer numbers, take the slots of that shape in index order. The one assumption is
//! that numbered layers are defined in numeric order (a `ModuleList`). Shapes shared by several
//! classes (`q_proj` and `o_proj`, layer norms and biases of one width) stay unpaired: their
//! tensors use magnitude-only sensitivity, and `show` says so.

use std::collections::{BTreeMap, HashMap};

use crate::input::Piece;

/// `(param, exp_avg, exp_avg_sq)` piece indices.
pub(crate) type OrderPair = (usize, usize, usize);

/// The pairs the optimizer's order forces (see the module's documentation). None when the
/// tree holds no optimizer state, or the state of more than one optimizer.
pub(crate) fn pair_by_order(pieces: &[Piece]) -> Vec<OrderPair> {
    // Optimizer slots: (file, prefix before "state.K.") → K → (exp_avg, exp_avg_sq).
    type Slots = BTreeMap<u64, (Option<usize>, Option<usize>)>;
    let mut optimizers: HashMap<(usize, &str), Slots> = HashMap::new();
    let mut is_state = vec![false; pieces.len()];
    for (i, p) in pieces.iter().enumerate() {
        let Some((prefix, k, moment)) = slot(&p.name).filter(|_| p.tensor) else {
            continue;
        };
        is_state[i] = true;
        let e = optimizers
            .entry((p.file, prefix))
            .or_default()
            .entry(k)
            .or_default();
        match moment {
            "exp_avg" => e.0 = Some(i),
            _ => e.1 = Some(i),
        }
    }
    if optimizers.len() != 1 {
        return Vec::new();
    }
    let slots = optimizers.into_values().next().expect("one optimizer");
    // Slots of each shape, in index order; a slot without both moments, or with moments of
    // two shapes, stops the pairing of everything (the state is not Adam's).
    let mut by_shape: HashMap<&[u64], Vec<(usize, usize)>> = HashMap::new();
    for (m, v) in slots.values() {
        let (Some(m), Some(v)) = (*m, *v) else {
            return Vec::new();
        };
        if pieces[m].header != pieces[v].header {
            return Vec::new();
        }
        by_shape
            .entry(&pieces[m].header.shape)
            .or_default()
            .push((m, v));
    }
    // Parameters: the float tensors that are not optimizer state, by shape, then class, each
    // with its layer numbers.
    type Members = Vec<(Vec<u64>, usize)>;
    let mut params: HashMap<&[u64], BTreeMap<String, Members>> = HashMap::new();
    for (i, p) in pieces.iter().enumerate() {
        if !p.tensor || is_state[i] || !p.header.dtype.is_float() {
            continue;
        }
        let (class, numbers) = class_of(&p.name);
        params
            .entry(&p.header.shape)
            .or_default()
            .entry(class)
            .or_default()
            .push((numbers, i));
    }
    let mut out = Vec::new();
    for (shape, slots) in by_shape {
        let Some(classes) = params.get_mut(shape) else {
            continue;
        };
        if classes.len() != 1 {
            continue;
        }
        let members = classes.values_mut().next().expect("one class");
        if members.len() != slots.len() {
            continue;
        }
        members.sort();
        for ((_, param), (m, v)) in members.iter().zip(slots) {
            out.push((*param, m, v));
        }
    }
    out.sort_unstable();
    out
}

/// `(prefix, K, moment)` of a name `PREFIX state.K.exp_avg` / `exp_avg_sq`.
pub(super) fn slot(name: &str) -> Option<(&str, u64, &str)> {
    let (rest, moment) = name.rsplit_once('.')?;
    if moment != "exp_avg" && moment != "exp_avg_sq" {
        return None;
    }
    let (rest, k) = rest.rsplit_once('.')?;
    let k: u64 = k.parse().ok()?;
    let prefix = rest.strip_suffix("state")?;
    (prefix.is_empty() || prefix.ends_with('.')).then_some((prefix, k, moment))
}

/// A name with its digit runs replaced by `#`, and those numbers in order.
fn class_of(name: &str) -> (String, Vec<u64>) {
    let mut class = String::with_capacity(name.len());
    let mut numbers = Vec::new();
    let mut digits = String::new();
    for c in name.chars().chain(std::iter::once('\0')) {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        if !digits.is_empty() {
            class.push('#');
            numbers.push(digits.parse().unwrap_or(u64::MAX));
            digits.clear();
        }
        if c != '\0' {
            class.push(c);
        }
    }
    (class, numbers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mdl_format::{Dtype, TensorHeader};

    fn piece(file: usize, name: &str, shape: &[u64]) -> Piece {
        let header = TensorHeader::new(Dtype::F32, shape.to_vec());
        Piece {
            file,
            name: name.into(),
            len: header.data_len().unwrap(),
            header,
            offset: 0,
            tensor: true,
        }
    }

    #[test]
    fn forced_pairs_only() {
        // GPT-2-like: weights of distinct shapes per class, layer norms and a bias of one
        // width; the optimizer's order is named_parameters order split by decay.
        let model = [
            ("h.1.attn.w", [8, 24]),
            ("h.0.attn.w", [8, 24]),
            ("h.10.attn.w", [8, 24]),
            ("wte", [50, 8]),
            ("h.0.ln.weight", [8, 1]),
            ("h.0.proj.bias", [8, 1]),
        ];
        let mut pieces: Vec<Piece> = model.iter().map(|(n, s)| piece(0, n, s)).collect();
        // Decay group: wte, h.0.attn.w, h.1.attn.w, h.10.attn.w; then ln and bias.
        let order: [&[u64]; 6] = [&[50, 8], &[8, 24], &[8, 24], &[8, 24], &[8, 1], &[8, 1]];
        for (k, s) in order.iter().enumerate() {
            pieces.push(piece(1, &format!("state.{k}.exp_avg"), s));
            pieces.push(piece(1, &format!("state.{k}.exp_avg_sq"), s));
        }
        let pairs = pair_by_order(&pieces);
        let named: Vec<(&str, &str)> = pairs
            .iter()
            .map(|&(p, m, _)| (pieces[p].name.as_str(), pieces[m].name.as_str()))
            .collect();
        assert_eq!(
            named,
            [
                ("h.1.attn.w", "state.2.exp_avg"),
                ("h.0.attn.w", "state.1.exp_avg"),
                ("h.10.attn.w", "state.3.exp_avg"),
                ("wte", "state.0.exp_avg"),
            ],
            "the [8, 1] tensors are two classes: not paired"
        );
        // A frozen parameter (no state) leaves its shape unpaired rather than shifting others.
        pieces.push(piece(0, "h.11.attn.w", &[8, 24]));
        let pairs = pair_by_order(&pieces);
        assert!(
            pairs.iter().all(|&(p, _, _)| pieces[p].name == "wte"),
            "{pairs:?}"
        );
        // Two optimizers: nothing is paired.
        pieces.push(piece(2, "state.0.exp_avg", &[50, 8]));
        pieces.push(piece(2, "state.0.exp_avg_sq", &[50, 8]));
        assert!(pair_by_order(&pieces).is_empty());
    }

    #[test]
    fn names_and_classes() {
        assert_eq!(slot("state.12.exp_avg"), Some(("", 12, "exp_avg")));
        assert_eq!(
            slot("optimizer_states.0.state.3.exp_avg_sq"),
            Some(("optimizer_states.0.", 3, "exp_avg_sq"))
        );
        assert_eq!(slot("state.x.exp_avg"), None);
        assert_eq!(slot("mystate.1.exp_avg"), None);
        assert_eq!(
            class_of("model.layers.10.mlp.up_proj.weight"),
            ("model.layers.#.mlp.up_proj.weight".to_string(), vec![10])
        );
    }
}
