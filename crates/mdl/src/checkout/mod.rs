//! `mdl checkout`: write a commit's files back — one file to a path, or a tree into a folder.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub use mdl_protocol::outcome::CheckoutOutcome;

use crate::{per_tensor, Error, Progress, Repository, Result};
use writes::Writes;

mod checked;
mod layout;
mod listing;
mod output;
pub mod patch;
pub mod target;
mod update;
mod writes;

pub use checked::CheckedFile;
pub use layout::{
    layout, layout_paths, layout_with, load_all_mirrored, FileLayout, Layout, Piece, Placed,
};
pub use listing::{listing, ListedFile, Listing};
pub use mdl_codec::engine::Mirror;
pub use output::{check_room, make_executable, refuse_inside_repository, temporary_output};

/// Options of a checkout.
#[derive(Clone, Debug, Default)]
pub struct CheckoutOptions {
    /// Overwrite an existing output file; write into a folder that is not empty, replacing
    /// the files of the tree.
    pub force: bool,
    /// fsync each file before renaming it into place.
    pub sync: bool,
    /// Write a thinned commit without what retention expired instead of failing.
    pub skip_expired: bool,
    /// Only this file, or the files under this folder, of the tree.
    pub path: Option<String>,
    /// The commit whose files the output holds: only what changed is written, in place
    /// (`update.rs`).
    pub since: Option<String>,
}

/// Files a checkout holds open at once.
const OPEN_FILES: usize = 256;

/// Writes the files of `rev` to `out`. A commit of one file (or `path` naming one file) is
/// written to `out` itself, or into `out` when that is a folder or ends in `/`; a tree is
/// written into the
/// folder `out`, created if missing, which must otherwise be empty unless `force`. Every file
/// goes through a temporary file renamed into place; a checkout that fails or is interrupted
/// leaves no file half-written, and removes the folder it created.
#[tracing::instrument(name = "checkout", skip_all, fields(rev, out = %out.display()))]
pub fn checkout(
    repo: &Repository,
    rev: &str,
    out: &Path,
    opts: &CheckoutOptions,
    progress: &dyn Progress,
) -> Result<CheckoutOutcome> {
    if let Some(held) = &opts.since {
        return update::update(repo, rev, held, out, opts, progress);
    }
    let (layout, selection) = selected(repo, rev, opts)?;
    let id = layout.commit;
    let targets = target::targets(out, &selection, opts.force)?;
    let _interrupted = targets
        .created
        .as_ref()
        .map(|c| crate::interrupt::register(c));
    let result = write_files(repo, &layout, &targets.paths, opts, progress);
    if result.is_err() {
        target::undo(&targets);
    }
    let bytes = result?;
    tracing::info!(commit = %id, bytes, "checked out");
    let lossy_tensors = layout.lossy_tensors();
    Ok(CheckoutOutcome {
        id,
        path: targets.reported,
        bytes,
        files: layout.files.len() as u32,
        lossy: lossy_tensors > 0,
        lossy_tensors,
        skipped: layout.skipped,
    })
}

/// The layout of `rev`'s files that `opts.path` selects (all of them without one), and the
/// selection.
fn selected(
    repo: &Repository,
    rev: &str,
    opts: &CheckoutOptions,
) -> Result<(Layout, target::Selection)> {
    let mut layout = layout_with(repo, rev, opts.skip_expired)?;
    let paths: Vec<&str> = layout.files.iter().map(|f| f.path.as_str()).collect();
    let selection = target::select(&paths, opts.path.as_deref(), &layout.commit.short(12))?;
    let mut index = 0;
    layout.files.retain(|_| {
        index += 1;
        selection.files.binary_search(&(index - 1)).is_ok()
    });
    Ok((layout, selection))
}

/// Writes each file of `layout` to its target through a temporary file beside it; the
/// objects decode in parallel (and chunk-parallel inside) a window at a time, each window
/// written at its offset by the file's one writer ([`writes`]). Returns the bytes written.
fn write_files(
    repo: &Repository,
    layout: &Layout,
    targets: &[PathBuf],
    opts: &CheckoutOptions,
    progress: &dyn Progress,
) -> Result<u64> {
    let write_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Output { path, source }
    };
    let store = repo.store();
    progress.start("writing", layout.len());
    // Files a batch at a time, so that a tree of many files never holds more open files than
    // the batch.
    let files: Vec<(usize, &FileLayout)> = layout.files.iter().enumerate().collect();
    for batch in files.chunks(OPEN_FILES) {
        let mut temps = Vec::with_capacity(batch.len());
        for &(i, f) in batch {
            let target = &targets[i];
            let tmp = temporary_output(target)?;
            for p in &f.pieces {
                if let Piece::Inline { offset, bytes } = p {
                    tmp.as_file()
                        .write_all_at(bytes, *offset)
                        .map_err(write_err(target))?;
                }
            }
            let registered = crate::interrupt::register(tmp.path());
            temps.push((tmp, registered));
        }
        let objects: Vec<(usize, &Placed)> = batch
            .iter()
            .enumerate()
            .flat_map(|(k, (_, f))| f.objects().map(move |o| (k, o)))
            .collect();
        // Decoded a window at a time (memory bounded by the windows, not the tensor) into
        // buffers handed to the files' writers.
        let writes = Writes::new(
            temps.iter().map(|(t, _)| t.as_file()).collect(),
            rayon::current_num_threads(),
        );
        let write_one = |&(k, t): &(usize, &Placed)| -> Result<()> {
            let mut w = store.tensor_windows(&t.id, &t.entry)?;
            while let Some((at, n)) = w.next_window() {
                let mut buf = writes.buffer(n);
                w.next_into(&mut buf[..n])?;
                writes
                    .write(k, t.offset + at, buf, n)
                    .map_err(|e| write_err(&targets[batch[e.file].0])(e.source))?;
            }
            w.finish()?;
            progress.advance(t.entry.content_len);
            Ok(())
        };
        per_tensor(&objects, |(_, t)| t.entry.content_len, write_one)?;
        writes
            .finish()
            .map_err(|e| write_err(&targets[batch[e.file].0])(e.source))?;
        for ((tmp, _registered), &(i, f)) in temps.into_iter().zip(batch) {
            let target = &targets[i];
            let file = tmp.as_file();
            // A file of only inline bytes, or an empty one, has its length already; one that
            // ends in an empty object is extended here.
            file.set_len(f.len).map_err(write_err(target))?;
            if f.executable {
                output::make_executable(file).map_err(write_err(target))?;
            }
            if opts.sync {
                file.sync_all().map_err(write_err(target))?;
            }
            tmp.persist(target)
                .map_err(|e| write_err(target)(e.error))?;
        }
    }
    progress.finish();
    Ok(layout.len())
}
