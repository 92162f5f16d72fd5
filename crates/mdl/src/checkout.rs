//! `mdl checkout`: write a commit's checkpoint back as a safetensors file.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use mdl_format::ObjectId;
use mdl_store::StoreError;
use serde::Serialize;

use crate::{revision, Error, Progress, Repository, Result};

/// Options of a checkout.
#[derive(Clone, Debug, Default)]
pub struct CheckoutOptions {
    /// Overwrite an existing output file.
    pub force: bool,
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
        let mut w = BufWriter::with_capacity(1 << 20, file);
        w.write_all(&(manifest.header_json.len() as u64).to_le_bytes())
            .map_err(write_err)?;
        w.write_all(&manifest.header_json).map_err(write_err)?;
        let meta = repo.store().meta().read()?;
        progress.start("writing", manifest.file_len());
        for e in &manifest.entries {
            let entry = meta.object(&e.id)?.ok_or(StoreError::Missing(e.id))?;
            repo.store()
                .read_object(&e.id, &entry, &mut w)
                .map_err(|err| match err {
                    StoreError::Output(source) => write_err(source),
                    other => other.into(),
                })?;
            progress.advance(entry.content_len);
        }
        progress.finish();
        let file = w.into_inner().map_err(|e| write_err(e.into_error()))?;
        file.sync_all().map_err(write_err)?;
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
