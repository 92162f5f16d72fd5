//! Files between this machine and a server: local paths committed there, and a commit's files
//! written here as `mdl checkout` writes them.

use std::path::{Path, PathBuf};

use std::io::Write;

use mdl::checkout::{target, CheckedFile, CheckoutOutcome};
use mdl::commit::{CommitOptions, CommitOutcome};
use mdl::names::printable;
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
///
/// Nothing the server says is taken on trust: the listing's names pass the tree rule
/// ([`mdl::names::check_tree`]) before anything is written; the commit and its manifest are
/// fetched and verified against the commit's id, the listing must be that manifest's tree, and
/// each file's bytes are checked against the manifest as they arrive — its length, every
/// object's hash, every inline byte — before the file is renamed into place.
pub fn download(
    remote: &Remote,
    rev: &str,
    out: &Path,
    path: Option<&str>,
    force: bool,
) -> Result<CheckoutOutcome> {
    let listing = remote.files(rev)?;
    let commit = listing.commit;
    let refuse = |why: String| Error::from(remote.refused(why));
    mdl::names::check_tree(listing.files.iter().map(|f| f.path.as_str()))
        .map_err(|e| refuse(format!("the files of {}: {e}", printable(rev))))?;
    if rev.len() == 64 && rev.parse::<mdl::ObjectId>().is_ok_and(|id| id != commit) {
        return Err(refuse(format!(
            "the files of {rev} are said to be commit {commit}"
        )));
    }
    let manifest = committed_tree(remote, &commit)?;
    let same =
        manifest.files.len() == listing.files.len()
            && manifest.files.iter().zip(&listing.files).all(|(m, l)| {
                m.path == l.path && m.len() == l.size && m.executable == l.executable
            });
    if !same {
        return Err(refuse(format!(
            "the files listed for {} are not those commit {commit} holds",
            printable(rev)
        )));
    }
    let paths: Vec<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
    let selection = target::select(&paths, path, &commit.short(12))?;
    let bytes: u64 = selection
        .files
        .iter()
        .map(|&i| manifest.files[i].len())
        .fold(0, u64::saturating_add);
    let lossy_tensors: u32 = selection
        .files
        .iter()
        .map(|&i| listing.files[i].lossy_tensors)
        .sum();
    mdl::checkout::check_room(out, bytes)?;
    let targets = target::targets(out, &selection, force)?;
    let _interrupted = targets
        .created
        .as_ref()
        .map(|c| mdl::interrupt::register(c));
    let result = selection
        .files
        .iter()
        .zip(&targets.paths)
        .try_for_each(|(&i, to)| download_file(remote, &commit, &manifest.files[i], to));
    if result.is_err() {
        target::undo(&targets);
    }
    result?;
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

/// The tree of commit `id` on the server: its commit and manifest records fetched and
/// verified against their ids.
fn committed_tree(remote: &Remote, id: &mdl::ObjectId) -> Result<mdl::Manifest> {
    let commit = mdl::transfer::read_commit(&mut remote.fetch_pack(&[*id], &[], None, 0)?, id)?;
    let manifest = &commit.manifest;
    Ok(mdl::transfer::read_manifest(
        &mut remote.fetch_pack(&[*manifest], &[], None, 0)?,
        manifest,
    )?)
}

/// Downloads `file` of commit `commit` to `out` through a temporary file, checked against the
/// manifest as it arrives.
fn download_file(
    remote: &Remote,
    commit: &mdl::ObjectId,
    file: &mdl::TreeFile,
    out: &Path,
) -> Result<()> {
    let write_err = |source| mdl::Error::Output {
        path: out.to_path_buf(),
        source,
    };
    let mut tmp = mdl::checkout::temporary_output(out)?;
    let _interrupted = mdl::interrupt::register(tmp.path());
    let mut checked = CheckedFile::new(file, std::io::BufWriter::new(tmp.as_file_mut()));
    remote.download_file(commit, &file.path, file.len(), &mut checked)?;
    let (mut written, unverified) = checked
        .finish()
        .map_err(|why| remote.refused(format!("commit {}: {why}", commit.short(12))))?;
    for (id, got) in unverified {
        coarsened_to(remote, file, &id, &got).map_err(|why| {
            remote.refused(format!("commit {}: {}: {why}", commit.short(12), file.path))
        })?;
    }
    written.flush().map_err(write_err)?;
    drop(written);
    if file.executable {
        mdl::checkout::make_executable(tmp.as_file()).map_err(write_err)?;
    }
    tmp.persist(out).map_err(|e| write_err(e.error))?;
    Ok(())
}

/// Checks a lossy tensor `id` of `file` whose bytes hashed to `got`, not to `id`: its record
/// must say that retention coarsened it to exactly that (as a clone trusts such a record: the
/// commit names the tensor, the record the coarsening), its header the manifest's.
fn coarsened_to(
    remote: &Remote,
    file: &mdl::TreeFile,
    id: &mdl::ObjectId,
    got: &mdl::ObjectId,
) -> std::result::Result<(), String> {
    let differs = || format!("object {} differs from the commit's", id.short(12));
    let header = file
        .regions
        .iter()
        .find_map(|r| r.object().filter(|(o, _)| o == id))
        .map(|(_, h)| h.canonical())
        .ok_or_else(differs)?;
    let mut pack = remote
        .fetch_pack(&[*id], &[], None, file.len())
        .map_err(|e| e.to_string())?;
    let record = mdl::transfer::read_tensor_header(&mut pack, id).map_err(|e| e.to_string())?;
    match record.coarsened {
        Some(c) if c.content == *got && record.prefix == header => Ok(()),
        _ => Err(differs()),
    }
}
