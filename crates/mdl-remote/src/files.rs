//! Files between this machine and a server: local paths committed there, and a commit's files
//! written here as `mdl checkout` writes them.

use std::path::{Path, PathBuf};

use mdl::checkout::{target, CheckoutOutcome};
use mdl::commit::{CommitOptions, CommitOutcome};
use mdl_client::TreeFile;

use crate::{Error, Remote, Result};

/// Commits `paths` on the server as `mdl commit` sends them: one file as it is, a folder or
/// several paths as one tree (each path a file entered under its name or a folder of files
/// under their relative paths, as a local commit lists them).
pub fn commit_paths(
    remote: &Remote,
    paths: &[PathBuf],
    opts: &CommitOptions,
) -> Result<CommitOutcome> {
    let params = opts.to_params().map_err(|why| Error::Remote(why.into()))?;
    if let [file] = paths {
        if !file.is_dir() {
            return Ok(remote.commit(file, &params)?);
        }
    }
    let files = mdl::commit::tree_files(paths, opts.reading.follow_links)?
        .into_iter()
        .map(|f| match std::fs::File::open(&f.source) {
            Ok(file) => Ok(TreeFile {
                tree_path: f.tree_path,
                source: f.source,
                file,
                executable: f.executable,
            }),
            Err(source) => Err(mdl::Error::Input {
                path: f.source,
                source,
            }),
        })
        .collect::<mdl::Result<Vec<_>>>()?;
    Ok(remote.commit_tree(files, &params)?)
}

/// Downloads `rev`'s files to `out` as `mdl checkout` writes them (`path`: one file or folder
/// of the tree): each through a temporary file renamed into place, all of the commit the
/// listing resolved `rev` to (files are fetched by its id, whatever the branch does meanwhile).
pub fn download(
    remote: &Remote,
    rev: &str,
    out: &Path,
    path: Option<&str>,
    force: bool,
) -> Result<CheckoutOutcome> {
    let listing = remote.files(rev)?;
    let commit = listing.commit;
    let paths: Vec<&str> = listing.files.iter().map(|f| f.path.as_str()).collect();
    let selection = target::select(&paths, path, &commit.short(12))?;
    let targets = target::targets(out, &selection, force)?;
    let _interrupted = targets
        .created
        .as_ref()
        .map(|c| mdl::interrupt::register(c));
    let result = (|| -> Result<(u64, u32)> {
        let (mut bytes, mut lossy) = (0, 0);
        for (&i, to) in selection.files.iter().zip(&targets.paths) {
            let f = &listing.files[i];
            bytes += download_file(remote, &commit, &f.path, to, f.executable)?;
            lossy += f.lossy_tensors;
        }
        Ok((bytes, lossy))
    })();
    if result.is_err() {
        target::undo(&targets);
    }
    let (bytes, lossy_tensors) = result?;
    Ok(CheckoutOutcome {
        id: commit,
        path: targets.reported,
        bytes,
        files: selection.files.len() as u32,
        lossy: lossy_tensors > 0,
        lossy_tensors,
        skipped: Vec::new(),
    })
}

/// Downloads one file of commit `commit` to `out` through a temporary file; returns its
/// length.
fn download_file(
    remote: &Remote,
    commit: &mdl::ObjectId,
    path: &str,
    out: &Path,
    exec: bool,
) -> Result<u64> {
    let write_err = |source| mdl::Error::Output {
        path: out.to_path_buf(),
        source,
    };
    let mut tmp = mdl::checkout::temporary_output(out)?;
    let _interrupted = mdl::interrupt::register(tmp.path());
    let n = remote.download_file(commit, path, tmp.as_file_mut())?;
    if exec {
        mdl::checkout::make_executable(tmp.as_file()).map_err(write_err)?;
    }
    tmp.persist(out).map_err(|e| write_err(e.error))?;
    Ok(n)
}
