//! `mdl checkout`: write a commit's checkpoint back as a safetensors file.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use mdl_format::ObjectId;
use mdl_store::{IndexEntry, StoreError};
use serde::{Deserialize, Serialize};

use crate::{per_tensor, revision, Error, Progress, Repository, Result, BIG_TENSOR};

/// Options of a checkout.
#[derive(Clone, Debug, Default)]
pub struct CheckoutOptions {
    /// Overwrite an existing output file.
    pub force: bool,
    /// fsync the file before renaming it into place.
    pub sync: bool,
    /// Write a thinned commit without its expired tensors instead of failing.
    pub skip_expired: bool,
}

thread_local! {
    static TENSOR_BUF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// What a checkout wrote.
#[derive(Clone, Debug, Serialize, Deserialize)]
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
    /// Tensors left out because retention expired them (`skip_expired`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

/// Refuses an output path inside any repository's `.mdl` directory (its directory resolved
/// through symlinks): a file written there could replace the database or a record.
pub fn refuse_inside_repository(out: &Path) -> Result<()> {
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let Ok(dir) = parent.canonicalize() else {
        return Ok(()); // A directory that does not exist fails when the file is created.
    };
    let inside = dir.ancestors().any(|a| {
        a.file_name() == Some(std::ffi::OsStr::new(mdl_store::MDL_DIR))
            && (a.join(mdl_store::meta::META_FILE).exists() || a.join("objects").is_dir())
    });
    if inside {
        return Err(Error::OutputInRepository(out.to_path_buf()));
    }
    Ok(())
}

/// The temporary file an output is written to before it is renamed to `out`: beside it, of an
/// unpredictable name, created exclusively (a planted file or symlink is never written
/// through), with the permissions of any new file (0666 less the umask, not a temporary
/// file's 0600). Removed when dropped unless persisted.
// The output is the user's file, never inside a repository (`refuse_inside_repository`).
#[allow(clippy::disallowed_methods)]
pub fn temporary_output(out: &Path) -> Result<tempfile::NamedTempFile> {
    use std::os::unix::fs::PermissionsExt;
    let err = |source| Error::Output {
        path: out.to_path_buf(),
        source,
    };
    let name = out
        .file_name()
        .ok_or_else(|| err(std::io::Error::other("not a file name")))?;
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    tempfile::Builder::new()
        .prefix(&format!(".{}.", name.to_string_lossy()))
        .suffix(".mdl-tmp")
        .permissions(std::fs::Permissions::from_mode(0o666))
        .tempfile_in(dir)
        .map_err(err)
}

/// Writes the checkpoint of `rev` to `out`, through a temporary file renamed into place.
#[tracing::instrument(name = "checkout", skip_all, fields(rev, out = %out.display()))]
pub fn checkout(
    repo: &Repository,
    rev: &str,
    out: &Path,
    opts: &CheckoutOptions,
    progress: &dyn Progress,
) -> Result<CheckoutOutcome> {
    refuse_inside_repository(out)?;
    let layout = layout_with(repo, rev, opts.skip_expired)?;
    let id = layout.commit;
    if !opts.force && out.symlink_metadata().is_ok() {
        return Err(Error::OutputExists(out.to_path_buf()));
    }
    let write_err = |source| Error::Output {
        path: out.to_path_buf(),
        source,
    };
    let tmp = temporary_output(out)?;
    let _interrupted = crate::interrupt::register(tmp.path());
    let result = (|| -> Result<u64> {
        let file = tmp.as_file();
        let store = repo.store();
        let total = layout.len;
        // Tensors decode in parallel (and chunk-parallel inside) into per-thread buffers; the
        // writes into the file go one at a time (concurrent writers of one file only contend
        // for its inode lock), each at its tensor's offset.
        file.write_all_at(&layout.head, 0).map_err(write_err)?;
        let writer = std::sync::Mutex::new(&file);
        progress.start("writing", total);
        let write_one = |t: &Placed| -> Result<()> {
            let (offset, entry) = (&t.offset, &t.entry);
            let len = entry.content_len as usize;
            // A per-thread buffer, taken out while in use (rayon may start another tensor on
            // this thread while this one waits for its chunks).
            let mut buf = TENSOR_BUF.take();
            if buf.len() < len {
                buf.resize(len, 0);
            }
            let result = store
                .load_tensor_into(&t.id, entry, &mut buf[..len])
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
        per_tensor(&layout.tensors, |t| t.entry.content_len, write_one)?;
        progress.finish();
        if opts.sync {
            file.sync_all().map_err(write_err)?;
        }
        Ok(total)
    })();
    match result {
        Ok(bytes) => {
            tmp.persist(out).map_err(|e| write_err(e.error))?;
            tracing::info!(commit = %id, bytes, "checked out");
            let lossy_tensors = layout.lossy_tensors();
            Ok(CheckoutOutcome {
                id,
                path: out.to_path_buf(),
                bytes,
                lossy: lossy_tensors > 0,
                lossy_tensors,
                skipped: layout.skipped,
            })
        }
        Err(e) => Err(e), // `tmp` removes itself
    }
}

/// Where everything lies in the safetensors file that checking out a commit writes, computed
/// from its manifest and the index alone (nothing is decoded): what a server needs to answer
/// a byte range by decoding only the tensors it touches.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The commit.
    pub commit: ObjectId,
    /// The file's first bytes: the header length (u64, little-endian) and the header JSON.
    pub head: Vec<u8>,
    /// The tensors in file order.
    pub tensors: Vec<Placed>,
    /// The file's length.
    pub len: u64,
    /// Expired tensors left out of the file (a thinned commit, written with `skip_expired`).
    pub skipped: Vec<String>,
}

/// One tensor's place in a [`Layout`].
#[derive(Clone, Debug)]
pub struct Placed {
    /// Its name in the checkpoint.
    pub name: String,
    /// Dtype and shape.
    pub header: mdl_format::TensorHeader,
    /// Whether it is a lossy reconstruction.
    pub lossy: bool,
    /// Its first byte in the file.
    pub offset: u64,
    /// The tensor object.
    pub id: ObjectId,
    /// Its index entry (`content_len` is its length in the file).
    pub entry: IndexEntry,
}

impl Placed {
    /// Decodes this tensor's bytes (verified against its id).
    pub fn load(&self, repo: &Repository) -> Result<Vec<u8>> {
        Ok(repo.store().load_tensor(&self.id, &self.entry)?)
    }
}

/// The layout of `rev`'s checkpoint; a thinned commit is [`Error::Expired`].
pub fn layout(repo: &Repository, rev: &str) -> Result<Layout> {
    layout_with(repo, rev, false)
}

/// The layout of `rev`'s checkpoint; with `skip_expired`, a thinned commit's file is laid out
/// without its expired tensors (a new header, offsets closed up).
pub fn layout_with(repo: &Repository, rev: &str, skip_expired: bool) -> Result<Layout> {
    let commit_id = revision::resolve(repo, rev)?;
    let commit = repo.load_commit(&commit_id)?;
    let manifest = repo.load_manifest(&commit.manifest)?;
    let meta = repo.store().meta().read()?;
    let mut skipped = Vec::new();
    let mut present = Vec::with_capacity(manifest.entries.len());
    for e in &manifest.entries {
        match meta.object(&e.id)? {
            Some(entry) => present.push((e, entry)),
            None if meta.expired(&e.id)?.is_some() => skipped.push(e.name.clone()),
            None => return Err(StoreError::Missing(e.id).into()),
        }
    }
    if !skipped.is_empty() && !skip_expired {
        return Err(Error::Expired {
            commit: commit_id.short(12),
            tensors: skipped,
        });
    }
    let header_json = if skipped.is_empty() {
        manifest.header_json.clone()
    } else {
        header_for(&manifest, &present)
    };
    let mut head = (header_json.len() as u64).to_le_bytes().to_vec();
    head.extend_from_slice(&header_json);
    let mut at = head.len() as u64;
    let expected_len = if skipped.is_empty() {
        manifest.file_len()
    } else {
        at + present.iter().map(|(_, e)| e.content_len).sum::<u64>()
    };
    let tensors = present
        .into_iter()
        .map(|(e, entry)| {
            let offset = at;
            at += entry.content_len;
            Ok(Placed {
                name: e.name.clone(),
                header: e.header.clone(),
                lossy: e.exactness.is_lossy(),
                offset,
                id: e.id,
                entry,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    if at != expected_len {
        return Err(Error::Corrupt {
            id: commit.manifest,
            source: mdl_format::FormatError::invalid(
                "manifest",
                "tensor sizes disagree with the file length",
            ),
        });
    }
    Ok(Layout {
        commit: commit_id,
        head,
        len: at,
        tensors,
        skipped,
    })
}

/// A safetensors header naming only `present` (in file order, offsets closed up), with the
/// manifest's metadata, padded with spaces to a multiple of 8 bytes.
fn header_for(
    manifest: &mdl_format::Manifest,
    present: &[(&mdl_format::Entry, IndexEntry)],
) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    if !manifest.metadata.is_empty() {
        let meta: serde_json::Map<String, serde_json::Value> = manifest
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        map.insert("__metadata__".into(), meta.into());
    }
    let mut at = 0u64;
    for (e, entry) in present {
        let end = at + entry.content_len;
        map.insert(
            e.name.clone(),
            serde_json::json!({
                "dtype": e.header.dtype.name(),
                "shape": e.header.shape,
                "data_offsets": [at, end],
            }),
        );
        at = end;
    }
    let mut bytes = serde_json::to_vec(&map).expect("JSON values serialise");
    while !bytes.len().is_multiple_of(8) {
        bytes.push(b' ');
    }
    bytes
}

impl Layout {
    /// How many tensors are lossy reconstructions.
    pub fn lossy_tensors(&self) -> u32 {
        self.tensors.iter().filter(|t| t.lossy).count() as u32
    }

    /// The tensors overlapping the byte range `start..end` of the file.
    pub fn touching(&self, start: u64, end: u64) -> impl Iterator<Item = &Placed> {
        let first = self
            .tensors
            .partition_point(|t| t.offset + t.entry.content_len <= start);
        self.tensors[first..]
            .iter()
            .take_while(move |t| t.offset < end)
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&Placed> {
        self.tensors.iter().find(|t| t.name == name)
    }
}
