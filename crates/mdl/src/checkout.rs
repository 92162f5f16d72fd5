//! `mdl checkout`: write a commit's checkpoint back as a safetensors file.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use mdl_format::ObjectId;
use mdl_store::{IndexEntry, StoreError};
use rayon::prelude::*;
use serde::Serialize;

use crate::{revision, Error, Progress, Repository, Result};

/// Options of a checkout.
#[derive(Clone, Debug, Default)]
pub struct CheckoutOptions {
    /// Overwrite an existing output file.
    pub force: bool,
    /// fsync the file before renaming it into place.
    pub sync: bool,
}

/// Tensors at least this large are decoded one at a time (chunk-parallel inside).
const BIG_TENSOR: u64 = 64 << 20;

/// What a checkout wrote.
#[derive(Clone, Debug, Serialize)]
pub struct CheckoutOutcome {
    /// The commit written.
    pub id: ObjectId,
    /// The output file.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
}

/// Writes the checkpoint of `rev` to `out`, through a temporary file renamed into place.
pub fn checkout(
    repo: &Repository,
    rev: &str,
    out: &Path,
    opts: &CheckoutOptions,
    progress: &dyn Progress,
) -> Result<CheckoutOutcome> {
    let id = revision::resolve(repo, rev)?;
    let commit = repo.load_commit(&id)?;
    let manifest = repo.load_manifest(&commit.manifest)?;
    if !opts.force && out.symlink_metadata().is_ok() {
        return Err(Error::OutputExists(out.to_path_buf()));
    }
    let name = out.file_name().ok_or_else(|| Error::Output {
        path: out.to_path_buf(),
        source: std::io::Error::other("not a file name"),
    })?;
    let tmp = out.with_file_name(format!(
        ".{}.mdl-tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let write_err = |source| Error::Output {
        path: out.to_path_buf(),
        source,
    };
    let result = (|| -> Result<u64> {
        let file = File::create(&tmp).map_err(write_err)?;
        let mut head = (manifest.header_json.len() as u64).to_le_bytes().to_vec();
        head.extend_from_slice(&manifest.header_json);
        file.write_all_at(&head, 0).map_err(write_err)?;
        let store = repo.store();
        let entries: Vec<(u64, ObjectId, IndexEntry)> = {
            let meta = store.meta().read()?;
            let mut at = head.len() as u64;
            manifest
                .entries
                .iter()
                .map(|e| {
                    let entry = meta.object(&e.id)?.ok_or(StoreError::Missing(e.id))?;
                    let offset = at;
                    at += entry.content_len;
                    Ok((offset, e.id, entry))
                })
                .collect::<Result<_>>()?
        };
        progress.start("writing", manifest.file_len());
        // Tensors decode in parallel (and chunk-parallel inside) and land at their offsets;
        // large ones go one at a time so memory stays near a few tensors.
        let write_one = |(offset, id, entry): &(u64, ObjectId, IndexEntry)| -> Result<()> {
            let data = store.load_tensor(id, entry)?;
            file.write_all_at(&data, *offset).map_err(write_err)?;
            progress.advance(entry.content_len);
            Ok(())
        };
        let (big, small): (Vec<_>, Vec<_>) =
            entries.iter().partition(|(_, _, e)| e.content_len >= BIG_TENSOR);
        big.into_iter().try_for_each(write_one)?;
        small.into_par_iter().try_for_each(write_one)?;
        progress.finish();
        if opts.sync {
            file.sync_all().map_err(write_err)?;
        }
        Ok(manifest.file_len())
    })();
    match result {
        Ok(bytes) => {
            std::fs::rename(&tmp, out).map_err(write_err)?;
            Ok(CheckoutOutcome {
                id,
                path: out.to_path_buf(),
                bytes,
            })
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}
