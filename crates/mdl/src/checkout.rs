//! `mdl checkout`: write a commit's checkpoint back as a safetensors file.

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

/// Gives the kernel `advice` for the whole pages inside `buf` (a slice of a shared file
/// mapping). Advice is a hint: failures (old kernels lack `MADV_POPULATE_WRITE`) are ignored.
fn advise_pages(buf: &[u8], advice: libc::c_int) {
    // SAFETY: sysconf has no preconditions.
    #[allow(unsafe_code)]
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let start = buf.as_ptr() as usize;
    let aligned = start.div_ceil(page) * page;
    let end = (start + buf.len()) / page * page;
    if end > aligned {
        // SAFETY: the range lies inside `buf`, part of a MAP_SHARED file mapping. Populating
        // only faults pages in; dropping them from a shared mapping keeps their contents (dirty
        // pages stay in the page cache and are faulted back on the next access), so no byte
        // the slice holds changes.
        #[allow(unsafe_code)]
        unsafe {
            libc::madvise(aligned as *mut libc::c_void, end - aligned, advice);
        }
    }
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
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(write_err)?;
        let total = manifest.file_len();
        file.set_len(total).map_err(write_err)?;
        let store = repo.store();
        let head_len = 8 + manifest.header_json.len() as u64;
        let entries: Vec<(ObjectId, IndexEntry)> = {
            let meta = store.meta().read()?;
            manifest
                .entries
                .iter()
                .map(|e| Ok((e.id, meta.object(&e.id)?.ok_or(StoreError::Missing(e.id))?)))
                .collect::<Result<_>>()?
        };
        if head_len + entries.iter().map(|(_, e)| e.content_len).sum::<u64>() != total {
            return Err(Error::Corrupt {
                id: commit.manifest,
                source: mdl_format::FormatError::invalid(
                    "manifest",
                    "tensor sizes disagree with the file length",
                ),
            });
        }
        if total == 0 {
            return Ok(0);
        }
        // Decode straight into the mapped output file: no copy through write(2), and no lock
        // contention between threads writing one file.
        // SAFETY: the file was just created by this process under a private temporary name and
        // sized above; nothing else maps or truncates it while the map is alive.
        #[allow(unsafe_code)]
        let mut map =
            unsafe { memmap2::MmapOptions::new().populate().map_mut(&file) }.map_err(write_err)?;
        let (head, mut rest) = map.split_at_mut(head_len as usize);
        head[..8].copy_from_slice(&(manifest.header_json.len() as u64).to_le_bytes());
        head[8..].copy_from_slice(&manifest.header_json);
        let mut slots: Vec<(&ObjectId, &IndexEntry, &mut [u8])> = Vec::with_capacity(entries.len());
        for (id, entry) in &entries {
            let (slot, r) = rest.split_at_mut(entry.content_len as usize);
            slots.push((id, entry, slot));
            rest = r;
        }
        progress.start("writing", total);
        // Tensors decode in parallel (and chunk-parallel inside); large ones go one at a time.
        // Each tensor's pages are faulted in in one call before decoding and dropped from this
        // process (not from the page cache) after, so resident memory follows the tensors in
        // flight rather than the file.
        let write_one = |(id, entry, slot): (&ObjectId, &IndexEntry, &mut [u8])| -> Result<()> {
            advise_pages(slot, libc::MADV_POPULATE_WRITE);
            store.load_tensor_into(id, entry, slot)?;
            advise_pages(slot, libc::MADV_DONTNEED);
            progress.advance(entry.content_len);
            Ok(())
        };
        let (big, small): (Vec<_>, Vec<_>) = slots
            .into_iter()
            .partition(|(_, e, _)| e.content_len >= BIG_TENSOR);
        big.into_iter().try_for_each(write_one)?;
        small.into_par_iter().try_for_each(write_one)?;
        progress.finish();
        if opts.sync {
            map.flush().map_err(write_err)?;
            file.sync_all().map_err(write_err)?;
        }
        Ok(total)
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
