//! `mdl diff`: which tensors changed between two commits, and by how much.

use std::collections::HashMap;

use mdl_format::{Dtype, Entry};
use serde::Serialize;

use crate::{revision, Repository, Result};

/// How a tensor differs.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Same object in both.
    Unchanged,
    /// Different bytes; for floats of equal dtype and shape, `‖b − a‖ / ‖a‖`.
    Changed {
        /// Relative L2 norm of the change (`null` for non-float or reshaped tensors).
        rel_l2: Option<f64>,
        /// dtype or shape differs.
        reshaped: bool,
    },
    /// Only in B.
    Added,
    /// Only in A.
    Removed,
}

/// One line of a diff.
#[derive(Clone, Debug, Serialize)]
pub struct TensorDiff {
    /// Tensor name.
    pub name: String,
    /// What happened to it.
    #[serde(flatten)]
    pub change: Change,
}

/// Compares the checkpoints of revisions `a` and `b`, in A's tensor order, then B's new ones.
pub fn diff(repo: &Repository, a: &str, b: &str) -> Result<Vec<TensorDiff>> {
    let (ia, ib) = (revision::resolve(repo, a)?, revision::resolve(repo, b)?);
    let ma = repo.load_manifest(&repo.load_commit(&ia)?.manifest)?;
    let mb = repo.load_manifest(&repo.load_commit(&ib)?.manifest)?;
    let in_b: HashMap<&str, &Entry> = mb.entries.iter().map(|e| (e.name.as_str(), e)).collect();
    let in_a: HashMap<&str, &Entry> = ma.entries.iter().map(|e| (e.name.as_str(), e)).collect();
    let mut out = Vec::new();
    for ea in &ma.entries {
        let change = match in_b.get(ea.name.as_str()) {
            None => Change::Removed,
            Some(eb) if eb.id == ea.id => Change::Unchanged,
            Some(eb) if eb.header != ea.header => Change::Changed {
                rel_l2: None,
                reshaped: true,
            },
            Some(eb) => Change::Changed {
                rel_l2: rel_l2(repo, ea, eb)?,
                reshaped: false,
            },
        };
        out.push(TensorDiff {
            name: ea.name.clone(),
            change,
        });
    }
    for eb in &mb.entries {
        if !in_a.contains_key(eb.name.as_str()) {
            out.push(TensorDiff {
                name: eb.name.clone(),
                change: Change::Added,
            });
        }
    }
    Ok(out)
}

fn rel_l2(repo: &Repository, a: &Entry, b: &Entry) -> Result<Option<f64>> {
    let dtype = a.header.dtype;
    if !dtype.is_float() {
        return Ok(None);
    }
    let va = repo.store().read_object_vec(&a.id)?;
    let vb = repo.store().read_object_vec(&b.id)?;
    let (mut num, mut den) = (0f64, 0f64);
    let size = dtype.size();
    for (x, y) in va.chunks_exact(size).zip(vb.chunks_exact(size)) {
        let (x, y) = (to_f64(dtype, x), to_f64(dtype, y));
        num += (y - x) * (y - x);
        den += x * x;
    }
    Ok(Some(if den > 0.0 {
        (num / den).sqrt()
    } else if num > 0.0 {
        f64::INFINITY
    } else {
        0.0
    }))
}

/// Reads one little-endian float element as f64.
pub fn to_f64(dtype: Dtype, b: &[u8]) -> f64 {
    match dtype {
        Dtype::F64 => f64::from_le_bytes(b.try_into().unwrap()),
        Dtype::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        Dtype::BF16 => {
            f32::from_bits((u16::from_le_bytes(b.try_into().unwrap()) as u32) << 16) as f64
        }
        Dtype::F16 => f16_to_f64(u16::from_le_bytes(b.try_into().unwrap())),
        _ => f64::NAN,
    }
}

fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let frac = (h & 0x3ff) as f64;
    sign * match exp {
        0 => frac * 2f64.powi(-24),
        31 if frac == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_precision_conversions() {
        assert_eq!(f16_to_f64(0x3c00), 1.0);
        assert_eq!(f16_to_f64(0xc000), -2.0);
        assert_eq!(f16_to_f64(0x0001), 2f64.powi(-24));
        assert_eq!(f16_to_f64(0x7bff), 65504.0);
        assert!(f16_to_f64(0x7c00).is_infinite());
        assert!(f16_to_f64(0x7e00).is_nan());
        assert_eq!(to_f64(Dtype::BF16, &0x3f80u16.to_le_bytes()), 1.0);
        assert_eq!(to_f64(Dtype::F32, &1.5f32.to_le_bytes()), 1.5);
    }
}
