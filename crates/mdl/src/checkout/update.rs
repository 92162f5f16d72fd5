//! `mdl checkout REV -o OUT --since HELD`: files that `OUT` holds as `HELD` wrote them brought
//! to `REV`'s in place — only the tensors whose content changed are decoded and written, at
//! their offsets; a tensor stored as a delta over the version in the file decodes against the
//! file's own bytes. A file whose layout changed (another header, other offsets) is written
//! whole as a checkout writes it; a file `HELD` had and `REV` has not is removed.
//!
//! Updated in place, a file is neither version while it is written: a failure or a kill part
//! way leaves it mixed (`mdl checkout REV -o OUT --force` writes it whole again). Each tensor
//! is verified against its id before its bytes go in; the tensors the two commits share are
//! taken as the file holds them (the caller says the file holds `HELD`), and the bytes the
//! manifest holds (a safetensors header) are compared first: a file that does not start as
//! `HELD`'s is written whole.

use std::collections::{HashMap, HashSet};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::checkout::{layout_with, target, CheckoutOptions, CheckoutOutcome, FileLayout, Piece};
use crate::{revision, Error, Progress, Repository, Result};

/// [`super::checkout`] of `rev` into `out`, which holds the files of `held` (`opts.since`).
pub(super) fn update(
    repo: &Repository,
    rev: &str,
    held: &str,
    out: &Path,
    opts: &CheckoutOptions,
    progress: &dyn Progress,
) -> Result<CheckoutOutcome> {
    let held = revision::resolve(repo, held)?;
    let (layout, selection) = super::selected(repo, rev, opts)?;
    let before = layout_with(repo, &held.to_hex(), false)?;
    let id = layout.commit;
    let targets = target::targets(out, &selection, true)?;
    let mut old: HashMap<&str, &FileLayout> =
        before.files.iter().map(|f| (f.path.as_str(), f)).collect();
    // One file written as a file pairs with the older commit's one file, whatever each was
    // called when committed.
    if let ([was], [now], Some(_)) = (&before.files[..], &layout.files[..], &selection.single) {
        old = HashMap::from([(now.path.as_str(), was)]);
    }
    let mut whole = Vec::new();
    let mut written = 0;
    progress.start("updating", layout.len());
    for (i, f) in layout.files.iter().enumerate() {
        let target = &targets.paths[i];
        match old.get(f.path.as_str()) {
            Some(was) if same_shape(was, f) && holds_inline(target, was)? => {
                written += patch(repo, f, was, target)?;
                progress.advance(f.len);
            }
            _ => whole.push(i),
        }
    }
    progress.finish();
    // What changed shape is written whole, as a checkout writes it.
    if !whole.is_empty() {
        let set: HashSet<usize> = whole.iter().copied().collect();
        let mut sub = layout.clone();
        let mut k = 0;
        sub.files.retain(|_| {
            k += 1;
            set.contains(&(k - 1))
        });
        let paths: Vec<_> = whole.iter().map(|&i| targets.paths[i].clone()).collect();
        written += super::write_files(repo, &sub, &paths, opts, progress)?;
    }
    // A tree's files that `held` had and `rev` has not go.
    if selection.single.is_none() {
        let now: HashSet<&str> = layout.files.iter().map(|f| f.path.as_str()).collect();
        for f in &before.files {
            let selected = opts.path.as_deref().is_none_or(|p| {
                let p = p.trim_matches('/');
                f.path == p || f.path.starts_with(&format!("{p}/"))
            });
            if selected && !now.contains(f.path.as_str()) {
                let gone = targets.reported.join(&f.path);
                if gone.is_file() {
                    #[allow(clippy::disallowed_methods)]
                    std::fs::remove_file(&gone).map_err(|source| Error::Output {
                        path: gone.clone(),
                        source,
                    })?;
                }
            }
        }
    }
    let lossy_tensors = layout.lossy_tensors();
    Ok(CheckoutOutcome {
        id,
        path: targets.reported,
        bytes: written,
        files: layout.files.len() as u32,
        lossy: lossy_tensors > 0,
        lossy_tensors,
        skipped: layout.skipped,
    })
}

/// Whether `new` lays its bytes out as `old` does: the same length, the same inline bytes at
/// the same offsets, objects of the same lengths at the same offsets.
fn same_shape(old: &FileLayout, new: &FileLayout) -> bool {
    old.len == new.len
        && old.executable == new.executable
        && old.pieces.len() == new.pieces.len()
        && old
            .pieces
            .iter()
            .zip(&new.pieces)
            .all(|(a, b)| match (a, b) {
                (
                    Piece::Inline {
                        offset: x,
                        bytes: p,
                    },
                    Piece::Inline {
                        offset: y,
                        bytes: q,
                    },
                ) => x == y && p == q,
                (Piece::Object(p), Piece::Object(q)) => {
                    p.offset == q.offset && p.entry.content_len == q.entry.content_len
                }
                _ => false,
            })
}

/// Whether the file at `path` is as long as `old` and holds its inline bytes (a safetensors
/// header) where `old` has them.
fn holds_inline(path: &Path, old: &FileLayout) -> Result<bool> {
    let Ok(file) = std::fs::File::open(path) else {
        return Ok(false);
    };
    let read_err = |source| Error::Output {
        path: path.to_path_buf(),
        source,
    };
    if file.metadata().map_err(read_err)?.len() != old.len {
        return Ok(false);
    }
    for p in &old.pieces {
        if let Piece::Inline { offset, bytes } = p {
            let mut got = vec![0u8; bytes.len()];
            file.read_exact_at(&mut got, *offset).map_err(read_err)?;
            if &got != bytes {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Writes into the file at `path`, which holds `old`, the objects of `new` whose ids differ,
/// each decoded (against the file's bytes where it is a delta over what they are) and verified
/// first. The bytes written.
// The checkout's output file, opened to be written in place: not a repository's file.
#[allow(clippy::disallowed_methods)]
fn patch(repo: &Repository, new: &FileLayout, old: &FileLayout, path: &Path) -> Result<u64> {
    let io_err = |source| Error::Output {
        path: path.to_path_buf(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_err)?;
    let mut written = 0;
    for (a, b) in old.pieces.iter().zip(&new.pieces) {
        let (Piece::Object(was), Piece::Object(now)) = (a, b) else {
            continue;
        };
        if was.id == now.id {
            continue;
        }
        let len = now.entry.content_len as usize;
        let mut there = vec![0u8; len];
        file.read_exact_at(&mut there, was.offset).map_err(io_err)?;
        let held = crate::Held::from([(was.id, there.as_slice())]);
        let mut bytes = vec![0u8; len];
        now.load_over(repo, &held, &mut bytes)?;
        file.write_all_at(&bytes, now.offset).map_err(io_err)?;
        written += len as u64;
    }
    Ok(written)
}
