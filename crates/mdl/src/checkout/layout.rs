//! Where every byte of a commit's files lies, computed from its manifest and the index alone
//! (nothing is decoded): what a checkout writes, and what a server needs to answer a byte range
//! by decoding only the objects it touches.

use mdl_codec::engine::{DeviceCopy, Mirror};
use mdl_format::{FileFormat, FileView, ObjectId, RegionView, TensorHeader};
use mdl_store::{IndexEntry, StoreError};

use crate::{revision, Error, Repository, Result};

/// The files of a commit, laid out.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The commit.
    pub commit: ObjectId,
    /// Its files, sorted by path.
    pub files: Vec<FileLayout>,
    /// What a thinned commit's checkout leaves out (`skip_expired`): expired tensors of a
    /// safetensors file by name, other files whose objects expired by path.
    pub skipped: Vec<String>,
}

/// One file of a [`Layout`].
#[derive(Clone, Debug)]
pub struct FileLayout {
    /// Its path in the tree.
    pub path: String,
    /// Whether checkout marks it executable.
    pub executable: bool,
    /// Its length.
    pub len: u64,
    /// Its bytes, in order.
    pub pieces: Vec<Piece>,
}

/// A run of a file's bytes.
#[derive(Clone, Debug)]
pub enum Piece {
    /// Bytes the manifest holds.
    Inline {
        /// Its first byte in the file.
        offset: u64,
        /// The bytes.
        bytes: Vec<u8>,
    },
    /// An object's bytes.
    Object(Placed),
}

impl Piece {
    /// Its first byte in the file.
    pub fn offset(&self) -> u64 {
        match self {
            Piece::Inline { offset, .. } => *offset,
            Piece::Object(p) => p.offset,
        }
    }

    /// Its length.
    pub fn len(&self) -> u64 {
        match self {
            Piece::Inline { bytes, .. } => bytes.len() as u64,
            Piece::Object(p) => p.entry.content_len,
        }
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One object's place in a file.
#[derive(Clone, Debug)]
pub struct Placed {
    /// A tensor's name in its file; empty for bytes.
    pub name: String,
    /// Dtype and shape (bytes: `u8`, `[len]`).
    pub header: TensorHeader,
    /// Whether it is a tensor (not bytes).
    pub tensor: bool,
    /// Whether it is a lossy reconstruction.
    pub lossy: bool,
    /// Its first byte in the file.
    pub offset: u64,
    /// The object.
    pub id: ObjectId,
    /// Its index entry (`content_len` is its length in the file).
    pub entry: IndexEntry,
}

impl Placed {
    /// Decodes this object's bytes (verified against its id).
    pub fn load(&self, repo: &Repository) -> Result<Vec<u8>> {
        Ok(repo.store().load_tensor(&self.id, &self.entry)?)
    }

    /// Decodes this object's bytes into `out` (exactly its length; verified against its id;
    /// on error `out` holds garbage).
    pub fn load_into(&self, repo: &Repository, out: &mut [u8]) -> Result<()> {
        Ok(repo.store().load_tensor_into(&self.id, &self.entry, out)?)
    }

    /// [`Placed::load_into`] for a caller that holds older versions decoded (`held`, by id:
    /// its own copy of a model at an older commit): a record stored as a delta over one of them
    /// decodes one level against those bytes instead of through its chain. The result is
    /// verified against the object's id all the same, so held bytes that are not what their id
    /// names fail the read; they never make it wrong.
    pub fn load_over(
        &self,
        repo: &Repository,
        held: &crate::Held<'_>,
        out: &mut [u8],
    ) -> Result<()> {
        if out.len() as u64 != self.entry.content_len {
            let short = std::io::Error::other("output size differs from the object's");
            return Err(mdl_store::StoreError::Output(short).into());
        }
        let mut windows = repo.store().held_windows(&self.id, &self.entry, held)?;
        while let Some((at, n)) = windows.next_window() {
            windows.next_into(&mut out[at as usize..at as usize + n])?;
        }
        windows.finish()?;
        Ok(())
    }

    /// [`Placed::load_into`], the bytes going to `copy` in a GPU's memory when the repository's
    /// engine is on that GPU: its decode kernels write there in place and the content is
    /// verified there (only the coded bytes cross to the device; [`Mirror::Written`], `out`
    /// left unspecified), or what the host decoded into `out` is copied over
    /// ([`Mirror::Copied`]). [`Mirror::NotMine`]: `out` holds the bytes, the caller copies.
    pub fn load_mirrored(
        &self,
        repo: &Repository,
        out: &mut [u8],
        copy: DeviceCopy,
    ) -> Result<Mirror> {
        let mut failed = None;
        let mirror = repo
            .store()
            .engine()
            .mirror_into(out, copy, &mut |buf| match self.load_into(repo, buf) {
                Ok(()) => true,
                Err(e) => {
                    failed = Some(e);
                    false
                }
            });
        match failed {
            Some(e) => Err(e),
            None => Ok(mirror),
        }
    }
}

/// [`Placed::load_mirrored`] of several tensors, each to its device address, tensor-parallel
/// as a checkout decodes. Returns the host bytes of those the engine did not put there
/// ([`Mirror::NotMine`]: the caller copies them), `None` for the others.
pub fn load_all_mirrored(
    repo: &Repository,
    tensors: &[(&Placed, DeviceCopy)],
) -> Result<Vec<Option<Vec<u8>>>> {
    crate::per_tensor(
        tensors,
        |(p, _)| p.entry.content_len,
        |&(p, copy)| {
            let mut buf = vec![0u8; p.entry.content_len as usize];
            Ok(match p.load_mirrored(repo, &mut buf, copy)? {
                Mirror::NotMine | Mirror::Failed => Some(buf),
                Mirror::Written | Mirror::Copied => None,
            })
        },
    )
}

impl Layout {
    /// How many tensors are lossy reconstructions.
    pub fn lossy_tensors(&self) -> u32 {
        self.files.iter().map(FileLayout::lossy_tensors).sum()
    }

    /// Total size of the files.
    pub fn len(&self) -> u64 {
        self.files.iter().map(|f| f.len).sum()
    }

    /// Whether the files hold no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The file at `path`.
    pub fn file(&self, path: &str) -> Option<&FileLayout> {
        self.files.iter().find(|f| f.path == path)
    }

    /// The commit's one file, when it has exactly one.
    pub fn single(&self) -> Option<&FileLayout> {
        match self.files.as_slice() {
            [f] => Some(f),
            _ => None,
        }
    }
}

impl FileLayout {
    /// Writes the file's bytes into `out` (exactly its length), decoding its objects (each
    /// verified against its id; on error `out` holds garbage).
    pub fn load_into(&self, repo: &Repository, out: &mut [u8]) -> Result<()> {
        for piece in &self.pieces {
            let at = piece.offset() as usize;
            let to = &mut out[at..at + piece.len() as usize];
            match piece {
                Piece::Inline { bytes, .. } => to.copy_from_slice(bytes),
                Piece::Object(o) => o.load_into(repo, to)?,
            }
        }
        Ok(())
    }

    /// The file's bytes (see [`FileLayout::load_into`]): for a file small enough to hold.
    pub fn load(&self, repo: &Repository) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.len as usize];
        self.load_into(repo, &mut out)?;
        Ok(out)
    }

    /// How many tensors are lossy reconstructions.
    pub fn lossy_tensors(&self) -> u32 {
        self.objects().filter(|t| t.lossy).count() as u32
    }

    /// The objects of the file, in order.
    pub fn objects(&self) -> impl Iterator<Item = &Placed> {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Object(o) => Some(o),
            Piece::Inline { .. } => None,
        })
    }

    /// The pieces overlapping the byte range `start..end` of the file.
    pub fn touching(&self, start: u64, end: u64) -> impl Iterator<Item = &Piece> {
        let first = self
            .pieces
            .partition_point(|p| p.offset() + p.len() <= start);
        self.pieces[first..]
            .iter()
            .take_while(move |p| p.offset() < end)
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&Placed> {
        self.objects().find(|t| t.tensor && t.name == name)
    }

    /// An id of the file's content: the hash of its pieces (inline bytes, and objects by id).
    /// Two files with the same id have the same bytes; computed from the manifest alone, it is
    /// what the file routes give as ETag.
    pub fn content_id(&self) -> ObjectId {
        let mut id = ContentId::new();
        for p in &self.pieces {
            match p {
                Piece::Inline { bytes, .. } => id.inline(bytes),
                Piece::Object(o) => id.object(&o.id),
            }
        }
        id.finish()
    }
}

/// The layout of `rev`'s files; a thinned commit is [`Error::Expired`].
pub fn layout(repo: &Repository, rev: &str) -> Result<Layout> {
    layout_with(repo, rev, false)
}

/// The layout of `rev`'s files; with `skip_expired`, a thinned commit's files are laid out
/// without what retention expired: a safetensors file without its expired tensors (a new
/// header, offsets closed up), any other file with an expired object not at all.
pub fn layout_with(repo: &Repository, rev: &str, skip_expired: bool) -> Result<Layout> {
    lay_out(repo, rev, skip_expired, |_| true)
}

/// The layout of the files of `rev` at `paths` only (those it has): a reader of one small file
/// of a large commit lays out that file, not the commit.
pub fn layout_paths(repo: &Repository, rev: &str, paths: &[&str]) -> Result<Layout> {
    lay_out(repo, rev, false, |p| paths.contains(&p))
}

fn lay_out(
    repo: &Repository,
    rev: &str,
    skip_expired: bool,
    keep: impl Fn(&str) -> bool,
) -> Result<Layout> {
    let commit_id = revision::resolve(repo, rev)?;
    let commit = repo.load_commit(&commit_id)?;
    let bytes = repo.load_manifest_bytes(&commit.manifest)?;
    let manifest = crate::view_manifest(&commit.manifest, &bytes)?;
    let meta = repo.store().meta().read()?;
    let corrupt = |detail: &str| Error::Corrupt {
        id: commit.manifest,
        source: mdl_format::FormatError::invalid("manifest", detail.to_string()),
    };
    let mut skipped = Vec::new();
    let mut files = Vec::new();
    for f in manifest.files().iter().filter(|f| keep(f.path)) {
        let mut pieces = Vec::with_capacity(f.region_count());
        let mut expired = Vec::new();
        let mut at = 0u64;
        for r in f.regions() {
            let piece = match r {
                RegionView::Inline(bytes) => Piece::Inline {
                    offset: at,
                    bytes: bytes.into_owned(),
                },
                _ => {
                    let (id, header) = r.object().expect("not inline");
                    let entry = match meta.object(&id)? {
                        Some(entry) => entry,
                        None if meta.expired(&id)?.is_some() => {
                            expired.push(match &r {
                                RegionView::Tensor(e) => e.name.to_string(),
                                _ => format!("{} (bytes)", f.path),
                            });
                            at += r.len();
                            continue;
                        }
                        None => return Err(StoreError::Missing(id).into()),
                    };
                    if Some(entry.content_len) != header.data_len() {
                        return Err(corrupt("an object's size disagrees with its region"));
                    }
                    let (name, tensor, lossy) = match &r {
                        RegionView::Tensor(e) => (e.name.to_string(), true, e.is_lossy()),
                        _ => (String::new(), false, false),
                    };
                    Piece::Object(Placed {
                        name,
                        header,
                        tensor,
                        lossy,
                        offset: at,
                        id,
                        entry,
                    })
                }
            };
            at += piece.len();
            pieces.push(piece);
        }
        if expired.is_empty() {
            files.push(FileLayout {
                path: f.path.to_string(),
                executable: f.executable,
                len: at,
                pieces,
            });
            continue;
        }
        if !skip_expired {
            // Reported once every file has been looked at.
            skipped.extend(expired);
            continue;
        }
        match f.format {
            // The header of a safetensors file names its tensors: it is rewritten without
            // the expired ones.
            FileFormat::Safetensors => {
                let kept: Vec<Placed> = pieces
                    .into_iter()
                    .filter_map(|p| match p {
                        Piece::Object(o) if o.tensor => Some(o),
                        _ => None,
                    })
                    .collect();
                files.push(safetensors_without(f, kept));
                skipped.extend(expired);
            }
            _ => skipped.push(f.path.to_string()),
        }
    }
    if !skip_expired && !skipped.is_empty() {
        return Err(Error::Expired {
            commit: commit_id.short(12),
            tensors: skipped,
        });
    }
    Ok(Layout {
        commit: commit_id,
        files,
        skipped,
    })
}

/// A safetensors file of only the `kept` tensors (in file order, offsets closed up), with the
/// file's metadata, its header padded with spaces to a multiple of 8 bytes.
fn safetensors_without(file: &FileView<'_>, kept: Vec<Placed>) -> FileLayout {
    let mut map = serde_json::Map::new();
    let meta: serde_json::Map<String, serde_json::Value> = file
        .metadata()
        .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
        .collect();
    if !meta.is_empty() {
        map.insert("__metadata__".into(), meta.into());
    }
    let mut at = 0u64;
    for t in &kept {
        let end = at + t.entry.content_len;
        map.insert(
            t.name.clone(),
            serde_json::json!({
                "dtype": t.header.dtype.name(),
                "shape": t.header.shape,
                "data_offsets": [at, end],
            }),
        );
        at = end;
    }
    let mut json = serde_json::to_vec(&map).expect("JSON values serialise");
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut head = (json.len() as u64).to_le_bytes().to_vec();
    head.extend_from_slice(&json);
    let mut at = head.len() as u64;
    let mut pieces = vec![Piece::Inline {
        offset: 0,
        bytes: head,
    }];
    for mut t in kept {
        t.offset = at;
        at += t.entry.content_len;
        pieces.push(Piece::Object(t));
    }
    FileLayout {
        path: file.path.to_string(),
        executable: file.executable,
        len: at,
        pieces,
    }
}

/// [`FileLayout::content_id`], fed a piece at a time (a listing computes it from the manifest
/// without laying the file out).
pub(crate) struct ContentId(mdl_format::TensorHasher);

impl ContentId {
    pub(crate) fn new() -> Self {
        ContentId(mdl_format::TensorHasher::new(b"mdl file\0"))
    }

    pub(crate) fn inline(&mut self, bytes: &[u8]) {
        self.0.update(&[0]);
        self.0.update(&(bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
    }

    pub(crate) fn object(&mut self, id: &ObjectId) {
        self.0.update(&[1]);
        self.0.update(id.as_bytes());
    }

    pub(crate) fn finish(self) -> ObjectId {
        self.0.finalize()
    }
}
