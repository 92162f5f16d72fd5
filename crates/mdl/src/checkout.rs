//! `mdl checkout`: write a commit's checkpoint back as a safetensors file.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use mdl_format::ObjectId;
use mdl_store::{IndexEntry, StoreError};
use serde::Serialize;

use crate::{per_tensor, revision, Error, Progress, Repository, Result, BIG_TENSOR};

/// Options of a checkout.
#[derive(Clone, Debug, Default)]
pub struct CheckoutOptions {
    /// Overwrite an existing output file.
    pub force: bool,
    /// fsync the file before renaming it into place.
    pub sync: bool,
}

thread_local! {
    static TENSOR_BUF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// What a checkout wrote.
#[derive(Clone, Debug, Serialize)]
pub struct CheckoutOutcome {
    /// The commit written.
    pub id: ObjectId,
    /// The output file.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// Whether some tensors are lossy reconstructions (written in their original dtypes).
    pub lossy: bool,
    /// How many.
    pub lossy_tensors: u32,
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
        let file = std::fs::File::create(&tmp).map_err(write_err)?;
        let store = repo.store();
        // Every tensor's index entry and its offset in the file.
        let mut at = 8 + manifest.header_json.len() as u64;
        let placed: Vec<(u64, &ObjectId, IndexEntry)> = {
            let meta = store.meta().read()?;
            manifest
                .entries
                .iter()
                .map(|e| {
                    let entry = meta.object(&e.id)?.ok_or(StoreError::Missing(e.id))?;
                    let offset = at;
                    at += entry.content_len;
                    Ok((offset, &e.id, entry))
                })
                .collect::<Result<_>>()?
        };
        let total = manifest.file_len();
        if at != total {
            return Err(Error::Corrupt {
                id: commit.manifest,
                source: mdl_format::FormatError::invalid(
                    "manifest",
                    "tensor sizes disagree with the file length",
                ),
            });
        }
        // Tensors decode in parallel (and chunk-parallel inside) into per-thread buffers; the
        // writes into the file go one at a time (concurrent writers of one file only contend
        // for its inode lock), each at its tensor's offset.
        let mut head = (manifest.header_json.len() as u64).to_le_bytes().to_vec();
        head.extend_from_slice(&manifest.header_json);
        file.write_all_at(&head, 0).map_err(write_err)?;
        let writer = std::sync::Mutex::new(&file);
        progress.start("writing", total);
        let write_one = |(offset, id, entry): &(u64, &ObjectId, IndexEntry)| -> Result<()> {
            let len = entry.content_len as usize;
            // A per-thread buffer, taken out while in use (rayon may start another tensor on
            // this thread while this one waits for its chunks).
            let mut buf = TENSOR_BUF.take();
            if buf.len() < len {
                buf.resize(len, 0);
            }
            let result = store
                .load_tensor_into(id, entry, &mut buf[..len])
                .map_err(Error::from)
                .and_then(|()| {
                    writer
                        .lock()
                        .unwrap()
                        .write_all_at(&buf[..len], *offset)
                        .map_err(write_err)
                });
            // Big tensors' buffers are not kept.
            if (len as u64) < BIG_TENSOR {
                TENSOR_BUF.set(buf);
            }
            result?;
            progress.advance(entry.content_len);
            Ok(())
        };
        per_tensor(&placed, |(_, _, e)| e.content_len, write_one)?;
        progress.finish();
        if opts.sync {
            file.sync_all().map_err(write_err)?;
        }
        Ok(total)
    })();
    match result {
        Ok(bytes) => {
            std::fs::rename(&tmp, out).map_err(write_err)?;
            let lossy_tensors = manifest
                .entries
                .iter()
                .filter(|e| e.exactness.is_lossy())
                .count() as u32;
            Ok(CheckoutOutcome {
                id,
                path: out.to_path_buf(),
                bytes,
                lossy: lossy_tensors > 0,
                lossy_tensors,
            })
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}
