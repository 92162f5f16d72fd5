//! `mdl diff`: which files and tensors changed between two commits, and by how much.

use std::cmp::Ordering;

use mdl_format::{Dtype, ManifestView, ObjectId};
use mdl_store::{budget, windowed_cost, IndexEntry, StoreError};

pub use mdl_protocol::history::{Change, Diff, FileChange, FileDiff, TensorDiff};

use crate::previous::Previous;
use crate::{revision, view_manifest, Repository, Result};

/// Compares the checkpoints of revisions `a` and `b`.
pub fn diff(repo: &Repository, a: &str, b: &str) -> Result<Diff> {
    diff_commits(
        repo,
        &revision::resolve(repo, a)?,
        &revision::resolve(repo, b)?,
    )
}

/// Bytes a comparison collected whole ([`diff_commits`], the web compare page) holds per byte
/// of its two manifests (decoded length) together: their bytes, read in place, the index of
/// the second's tensors and the list of differences (measured at 1,000,000 tensors a commit,
/// for the compare page: 3.4; see `docs/BENCHMARKS.md`).
pub const MANIFEST_COST: u64 = 5;

/// Bytes a comparison walked ([`Compared::tensors`], each difference handed on as it is
/// found) holds per byte of its two manifests together: their bytes and the index of the
/// second's tensors (measured at 1,000,000 tensors a commit: 1.74).
pub const WALK_COST: u64 = 2;

/// Compares the checkpoints of commits `a` and `b`, collected whole under a share of the
/// decode budget of [`MANIFEST_COST`] times their manifests' length (see [`compare`]).
pub fn diff_commits(repo: &Repository, a: &ObjectId, b: &ObjectId) -> Result<Diff> {
    let mut compared = compare(repo, a, b, MANIFEST_COST)?;
    let files = compared.files()?;
    let mut tensors = Vec::new();
    compared.tensors(repo, |t| {
        tensors.push(t);
        Ok(())
    })?;
    Ok(Diff { files, tensors })
}

/// Two commits' manifests loaded to be compared, checked, with the comparison's share of the
/// decode budget.
pub struct Compared {
    a: (ObjectId, Vec<u8>),
    b: (ObjectId, Vec<u8>),
    held: budget::Reservation,
}

/// Loads the manifests of commits `a` and `b` to be compared, under a share of the decode
/// budget of `per_byte` times their length ([`MANIFEST_COST`] to collect the comparison,
/// [`WALK_COST`] to walk it), reserved before they are read — a comparison that needs more than
/// the whole budget is refused at once ([`Error::TooLarge`]). Both are read in place
/// ([`mdl_format::ManifestView`]), not decoded.
pub fn compare(repo: &Repository, a: &ObjectId, b: &ObjectId, per_byte: u64) -> Result<Compared> {
    let len = repo.manifest_len(a)? + repo.manifest_len(b)?;
    let held = crate::limits::reserve_or_refuse(len.saturating_mul(per_byte), || {
        format!(
            "comparing these commits ({} MiB of manifests)",
            len.div_ceil(1 << 20)
        )
    })?;
    let load = |commit: &ObjectId| -> Result<(ObjectId, Vec<u8>)> {
        let id = repo.load_commit(commit)?.manifest;
        let bytes = repo.load_manifest_bytes(&id)?;
        view_manifest(&id, &bytes)?;
        Ok((id, bytes))
    };
    Ok(Compared {
        a: load(a)?,
        b: load(b)?,
        held,
    })
}

impl Compared {
    /// Every file of either tree, in path order: removed, added, changed (any region differs)
    /// or not.
    pub fn files(&self) -> Result<Vec<FileDiff>> {
        Ok(diff_files(
            &view_manifest(&self.a.0, &self.a.1)?,
            &view_manifest(&self.b.0, &self.b.1)?,
        ))
    }

    /// Hands `each` every tensor of A in tree order (removed, unchanged, changed: a changed
    /// float tensor of the same shape measured, its windows reserved meanwhile), then B's new
    /// ones. A tensor is matched by file and name, or by name alone where B has it once.
    pub fn tensors(
        &mut self,
        repo: &Repository,
        mut each: impl FnMut(TensorDiff) -> Result<()>,
    ) -> Result<()> {
        let Compared { a, b, held } = self;
        let ma = view_manifest(&a.0, &a.1)?;
        let mb = view_manifest(&b.0, &b.1)?;
        let in_b = Previous::of_view(&mb);
        let mut matched = vec![false; mb.tensor_count() as usize];
        for (f, ea) in ma.tensors() {
            let path = ma.files()[f].path;
            let found = in_b.get(path, ea.name);
            let change = match found {
                None => Change::Removed,
                Some((n, eb)) => {
                    matched[n] = true;
                    if eb.id() == ea.id() {
                        Change::Unchanged
                    } else if eb.header() != ea.header() {
                        Change::Changed {
                            rel_l2: None,
                            reshaped: true,
                        }
                    } else {
                        Change::Changed {
                            rel_l2: rel_l2(repo, ea.dtype(), &ea.id(), &eb.id(), held)?,
                            reshaped: false,
                        }
                    }
                }
            };
            each(TensorDiff {
                file: path.to_string(),
                name: ea.name.to_string(),
                change,
            })?;
        }
        drop(in_b);
        for (n, (f, eb)) in mb.tensors().enumerate() {
            if !matched[n] {
                each(TensorDiff {
                    file: mb.files()[f].path.to_string(),
                    name: eb.name.to_string(),
                    change: Change::Added,
                })?;
            }
        }
        Ok(())
    }
}

/// The files of `a` and `b` merged by path: removed, added, changed (any region differs) or
/// not.
fn diff_files(a: &ManifestView<'_>, b: &ManifestView<'_>) -> Vec<FileDiff> {
    let mut files = Vec::new();
    let (mut i, mut j) = (0, 0);
    let (fa, fb) = (a.files(), b.files());
    while i < fa.len() || j < fb.len() {
        let (x, y) = (fa.get(i), fb.get(j));
        let order = match (x, y) {
            (Some(x), Some(y)) => x.path.cmp(y.path),
            (Some(_), None) => Ordering::Less,
            _ => Ordering::Greater,
        };
        files.push(match (order, x, y) {
            (Ordering::Less, Some(x), _) => {
                i += 1;
                file_diff(x.path, FileChange::Removed, Some(x.len()), None)
            }
            (Ordering::Greater, _, Some(y)) => {
                j += 1;
                file_diff(y.path, FileChange::Added, None, Some(y.len()))
            }
            (_, Some(x), Some(y)) => {
                i += 1;
                j += 1;
                let change = if x.regions().eq(y.regions()) {
                    FileChange::Unchanged
                } else {
                    FileChange::Changed
                };
                file_diff(x.path, change, Some(x.len()), Some(y.len()))
            }
            _ => unreachable!("one side has a file"),
        });
    }
    files
}

fn file_diff(path: &str, change: FileChange, a: Option<u64>, b: Option<u64>) -> FileDiff {
    FileDiff {
        path: path.to_string(),
        change,
        bytes_a: a,
        bytes_b: b,
    }
}

/// The relative L2 change from `a` to `b` (same dtype and shape), both versions read side by
/// side a window at a time, under the decode budget: a diff holds a few windows, not two
/// tensors, however large they are. `held` (the comparison's) grows by the windows meanwhile.
fn rel_l2(
    repo: &Repository,
    dtype: Dtype,
    a: &ObjectId,
    b: &ObjectId,
    held: &mut budget::Reservation,
) -> Result<Option<f64>> {
    if !dtype.is_float() {
        return Ok(None);
    }
    let store = repo.store();
    let (ia, ib) = {
        let meta = store.meta().read()?;
        let entry = |id: &ObjectId| -> Result<IndexEntry> {
            Ok(meta.object(id)?.ok_or(StoreError::Missing(*id))?)
        };
        (entry(a)?, entry(b)?)
    };
    let base = held.bytes();
    held.resize(base + windowed_cost(&ia) + windowed_cost(&ib));
    let mut wa = store.tensor_windows(a, &ia)?;
    let mut wb = store.tensor_windows(b, &ib)?;
    let (mut ba, mut bb) = (Vec::new(), Vec::new());
    let (mut num, mut den) = (0f64, 0f64);
    let size = dtype.size();
    while let Some((_, na)) = wa.next_window() {
        // A window either record takes whole: a float record's own (any length fits a record
        // decoded whole or streamed).
        let n = na.max(wb.next_window().map_or(0, |(_, n)| n));
        ba.resize(n, 0);
        bb.resize(n, 0);
        wa.next_into(&mut ba)?;
        wb.next_into(&mut bb)?;
        for (x, y) in ba.chunks_exact(size).zip(bb.chunks_exact(size)) {
            let (x, y) = (to_f64(dtype, x), to_f64(dtype, y));
            num += (y - x) * (y - x);
            den += x * x;
        }
    }
    wa.finish()?;
    wb.finish()?;
    held.resize(base);
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
