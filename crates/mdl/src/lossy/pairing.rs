//! Moment pairing and roles: which tensors are parameters with Adam moments, moments,
//! embeddings, or stored exactly, from their names.

use std::collections::HashMap;

use mdl_codec::scalar::lossy_supported;

use super::settings::invalid;
use super::{LossySettings, MIN_LOSSY_ELEMENTS, MOMENTS_KEY};
use crate::input::Piece;
use crate::Result;

/// A parameter and its moments, each a name pattern with one `{}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pairing {
    /// The parameter's pattern.
    pub weight: String,
    /// The first moment's pattern.
    pub m: String,
    /// The second moment's pattern.
    pub v: String,
}

impl Pairing {
    /// Parses `W:M:V[,W:M:V…]`.
    pub fn parse_list(s: &str) -> Result<Vec<Pairing>> {
        let bad = || {
            invalid(
                MOMENTS_KEY,
                s,
                "comma-separated WEIGHT:EXP_AVG:EXP_AVG_SQ patterns, each with one {}",
            )
        };
        s.split(',')
            .map(|p| {
                let parts: Vec<&str> = p.trim().split(':').collect();
                if parts.len() != 3 || parts.iter().any(|x| x.matches("{}").count() != 1) {
                    return Err(bad());
                }
                Ok(Pairing {
                    weight: parts[0].into(),
                    m: parts[1].into(),
                    v: parts[2].into(),
                })
            })
            .collect()
    }

    /// The `{}` part of `name` if it matches `pattern`.
    pub(crate) fn capture<'n>(pattern: &str, name: &'n str) -> Option<&'n str> {
        let (pre, post) = pattern.split_once("{}")?;
        let rest = name.strip_prefix(pre)?.strip_suffix(post)?;
        (!rest.is_empty()).then_some(rest)
    }
}

/// Whether `name` matches a glob with `*` wildcards.
pub(super) fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let mut rest = name;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
    }
    true
}

/// What a tensor is, for the lossy codecs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// A parameter; `family` is its pairing's index (its loss budget), `moments` the indices
    /// of its `exp_avg` and `exp_avg_sq` tensors.
    Param {
        family: Option<usize>,
        moments: Option<(usize, usize)>,
        embedding: bool,
    },
    /// Some parameter's `exp_avg`.
    FirstMoment,
    /// Some parameter's `exp_avg_sq`.
    SecondMoment,
    /// Stays lossless (not a float the quantizer takes, or too small).
    Exact,
}

/// Each tensor's role, from names, dtypes and shapes: the `client`'s pairs `(param, exp_avg,
/// exp_avg_sq)` first (family `s.pairings.len() + 1`), then moments found by the name patterns
/// of `s.pairings`, else by the optimizer's order (family `s.pairings.len()`).
pub(crate) fn roles(
    pieces: &[Piece],
    s: &LossySettings,
    client: &[(usize, usize, usize)],
) -> Vec<Role> {
    let by_order = super::order::pair_by_order(pieces);
    let by_name: HashMap<&str, usize> = pieces
        .iter()
        .enumerate()
        .filter(|(_, t)| t.tensor)
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    let eligible = |i: usize| {
        let t = &pieces[i];
        t.tensor
            && lossy_supported(t.header.dtype)
            && t.header.numel().unwrap_or(0) >= MIN_LOSSY_ELEMENTS
    };
    let mut roles = vec![Role::Exact; pieces.len()];
    // Moments first: a name matching a moment pattern is a moment even if it also looks like
    // a parameter.
    for (i, t) in pieces.iter().enumerate() {
        if !eligible(i) {
            continue;
        }
        for p in &s.pairings {
            if Pairing::capture(&p.m, &t.name).is_some() {
                roles[i] = Role::FirstMoment;
            } else if Pairing::capture(&p.v, &t.name).is_some() {
                roles[i] = Role::SecondMoment;
            }
        }
        // An optimizer state dict's moments, paired or not.
        match super::order::slot(&t.name) {
            Some((_, _, "exp_avg")) => roles[i] = Role::FirstMoment,
            Some(_) => roles[i] = Role::SecondMoment,
            None => {}
        }
    }
    // What the client says is certain: its moments are moments, its parameters have them.
    for &(p, m, v) in client {
        if [p, m, v].iter().all(|&i| eligible(i))
            && pieces[m].header.shape == pieces[p].header.shape
            && pieces[v].header.shape == pieces[p].header.shape
        {
            roles[m] = Role::FirstMoment;
            roles[v] = Role::SecondMoment;
            roles[p] = Role::Param {
                family: Some(s.pairings.len() + 1),
                moments: Some((m, v)),
                embedding: s.embeddings.iter().any(|g| glob(g, &pieces[p].name)),
            };
        }
    }
    for (i, t) in pieces.iter().enumerate() {
        if !eligible(i) || roles[i] != Role::Exact {
            continue;
        }
        let embedding = s.embeddings.iter().any(|g| glob(g, &t.name));
        let mut role = Role::Param {
            family: None,
            moments: None,
            embedding,
        };
        for (f, p) in s.pairings.iter().enumerate() {
            let Some(x) = Pairing::capture(&p.weight, &t.name) else {
                continue;
            };
            let (mn, vn) = (p.m.replace("{}", x), p.v.replace("{}", x));
            if let (Some(&mi), Some(&vi)) = (by_name.get(mn.as_str()), by_name.get(vn.as_str())) {
                let same = |j: usize| pieces[j].header.shape == t.header.shape;
                if same(mi) && same(vi) && eligible(mi) && eligible(vi) {
                    role = Role::Param {
                        family: Some(f),
                        moments: Some((mi, vi)),
                        embedding,
                    };
                    break;
                }
            }
        }
        if role
            == (Role::Param {
                family: None,
                moments: None,
                embedding,
            })
        {
            // No name pattern found its moments: the optimizer's order may have.
            if let Some(&(_, mi, vi)) = by_order.iter().find(|(p, _, _)| *p == i) {
                if eligible(mi) && eligible(vi) {
                    role = Role::Param {
                        family: Some(s.pairings.len()),
                        moments: Some((mi, vi)),
                        embedding,
                    };
                }
            }
        }
        roles[i] = role;
    }
    roles
}
