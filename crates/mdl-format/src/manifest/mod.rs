//! A commit's table of contents: the tree of files it holds, each cut into regions (tensors,
//! byte objects, inline bytes) that a checkout concatenates back into the file.

use crate::names::check_tree;
use crate::{Dtype, FormatError, ObjectId, TensorHeader};

mod encoding;
mod view;

pub use view::{EntryView, FileView, ManifestView, RegionView};

/// Whether a stored tensor reproduces the committed bytes exactly.
#[derive(Clone, Debug, PartialEq)]
pub enum Exactness {
    /// Checkout writes the committed bytes.
    Lossless,
    /// Checkout writes a reconstruction; the settings and the measured error are recorded.
    Lossy(Lossy),
}

/// How a lossy tensor was made and what it cost, measured on the reconstruction at commit.
#[derive(Clone, Debug, PartialEq)]
pub struct Lossy {
    /// The lossy codec's settings as `key=value` words (e.g. `quant bins=8 prune=0.2 …`).
    pub settings: String,
    /// Largest absolute difference between the reconstruction and the committed tensor.
    pub max_abs_error: f64,
    /// Relative L2 error of the reconstruction against the committed tensor.
    pub rel_error: f64,
    /// Estimated change of the training loss from this tensor's error, when the checkpoint
    /// carried its optimizer moments.
    pub est_delta_loss: Option<f64>,
}

impl Lossy {
    /// The value of the `key=value` word `key` in [`Self::settings`].
    pub fn setting(&self, key: &str) -> Option<&str> {
        self.settings
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
    }
}

impl Exactness {
    /// Whether this is [`Exactness::Lossy`].
    pub fn is_lossy(&self) -> bool {
        matches!(self, Exactness::Lossy(_))
    }

    /// The lossy details, if any.
    pub fn lossy(&self) -> Option<&Lossy> {
        match self {
            Exactness::Lossy(l) => Some(l),
            Exactness::Lossless => None,
        }
    }
}

/// One tensor of a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Its name in the file: the safetensors key, or the path in a pickle's object graph.
    pub name: String,
    /// Dtype and shape.
    pub header: TensorHeader,
    /// The tensor object.
    pub id: ObjectId,
    /// Lossless or lossy.
    pub exactness: Exactness,
}

/// How a file of the tree was split. Stable tags, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FileFormat {
    /// Stored as bytes (not a format mdl splits, or one it could not: see the file's note).
    Bytes = 0,
    /// A safetensors file: its header, then one tensor per entry.
    Safetensors = 1,
    /// A `torch.save` zip archive: each storage a tensor, the rest bytes.
    Torch = 2,
}

impl FileFormat {
    /// The lowercase name used in messages and JSON.
    pub fn name(self) -> &'static str {
        match self {
            FileFormat::Bytes => "bytes",
            FileFormat::Safetensors => "safetensors",
            FileFormat::Torch => "torch",
        }
    }
}

impl TryFrom<u8> for FileFormat {
    type Error = FormatError;
    fn try_from(v: u8) -> Result<Self, FormatError> {
        match v {
            0 => Ok(FileFormat::Bytes),
            1 => Ok(FileFormat::Safetensors),
            2 => Ok(FileFormat::Torch),
            tag => Err(FormatError::UnknownTag {
                what: "file format",
                tag,
            }),
        }
    }
}

/// A run of a file's bytes.
#[derive(Clone, Debug, PartialEq)]
pub enum Region {
    /// Bytes kept in the manifest itself (headers and other short runs).
    Inline(Vec<u8>),
    /// Bytes stored as an object: a `u8` tensor of shape `[len]`.
    Bytes {
        /// The object.
        id: ObjectId,
        /// Its length.
        len: u64,
    },
    /// A tensor's bytes.
    Tensor(Entry),
}

impl Region {
    /// The region's length in the file.
    pub fn len(&self) -> u64 {
        match self {
            Region::Inline(b) => b.len() as u64,
            Region::Bytes { len, .. } => *len,
            Region::Tensor(e) => e.header.data_len().unwrap_or(0),
        }
    }

    /// Whether the region holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The object the region's bytes are stored in, with its header; `None` for inline bytes.
    pub fn object(&self) -> Option<(ObjectId, TensorHeader)> {
        match self {
            Region::Inline(_) => None,
            Region::Bytes { id, len } => Some((*id, bytes_header(*len))),
            Region::Tensor(e) => Some((e.id, e.header.clone())),
        }
    }
}

/// The header of a byte object of `len` bytes: a `u8` tensor of shape `[len]`.
pub fn bytes_header(len: u64) -> TensorHeader {
    TensorHeader::new(Dtype::U8, vec![len])
}

/// One file of a commit's tree.
#[derive(Clone, Debug, PartialEq)]
pub struct TreeFile {
    /// Its path in the tree: `/`-separated, relative (see [`crate::check_path`]).
    pub path: String,
    /// How it was split.
    pub format: FileFormat,
    /// Whether checkout marks it executable.
    pub executable: bool,
    /// Why a file that looked like a format mdl splits was stored as bytes; empty otherwise.
    pub note: String,
    /// A safetensors file's `__metadata__` pairs, sorted by key; empty for other formats.
    pub metadata: Vec<(String, String)>,
    /// The file's bytes, in order.
    pub regions: Vec<Region>,
}

impl TreeFile {
    /// The file's size.
    pub fn len(&self) -> u64 {
        self.regions.iter().map(Region::len).sum()
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The file's tensors, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = &Entry> {
        self.regions.iter().filter_map(|r| match r {
            Region::Tensor(e) => Some(e),
            _ => None,
        })
    }
}

/// Where a parameter's Adam moments were found. Stable tags, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum PairSource {
    /// Matched by name patterns (the `lossy.moments` configuration).
    Names = 0,
    /// Matched by the optimizer's parameter order, checked by shape.
    OptimizerOrder = 1,
    /// Supplied by the client that made the commit (it knew the optimizer's parameters).
    Client = 2,
}

/// A parameter and its two Adam moments, as indices into [`Manifest::tensors`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MomentPair {
    /// The parameter.
    pub param: u32,
    /// Its `exp_avg`.
    pub exp_avg: u32,
    /// Its `exp_avg_sq`.
    pub exp_avg_sq: u32,
    /// How the pairing was established.
    pub source: PairSource,
}

/// A commit's tree: its files (sorted by path) and the moment pairing of its tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    /// The files, sorted by path (byte order), no path a directory of another.
    pub files: Vec<TreeFile>,
    /// Which tensors are a parameter's Adam moments (empty when none were paired).
    pub pairs: Vec<MomentPair>,
    /// The manifest layout version these values were read from (1 or 2); encoding writes it.
    version: u16,
}

/// The path a version 1 manifest's single safetensors file is given in the tree (version 1
/// manifests recorded no file name).
pub const V1_FILE_PATH: &str = "model.safetensors";

impl Manifest {
    /// A manifest of the current layout version; files are sorted by path, and every path is
    /// checked.
    pub fn new(mut files: Vec<TreeFile>, pairs: Vec<MomentPair>) -> Result<Self, FormatError> {
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let m = Manifest {
            files,
            pairs,
            version: encoding::CURRENT_VERSION,
        };
        m.check()?;
        Ok(m)
    }

    /// The layout version the manifest is encoded with.
    pub fn version(&self) -> u16 {
        self.version
    }

    /// Every tensor of every file, in tree then file order, with its file's index.
    pub fn tensors(&self) -> impl Iterator<Item = (usize, &Entry)> {
        self.files
            .iter()
            .enumerate()
            .flat_map(|(i, f)| f.tensors().map(move |e| (i, e)))
    }

    /// Every object the tree's bytes are stored in (tensors and byte objects, repeats
    /// included), with its header.
    pub fn objects(&self) -> impl Iterator<Item = (ObjectId, TensorHeader)> + '_ {
        self.files
            .iter()
            .flat_map(|f| f.regions.iter().filter_map(Region::object))
    }

    /// The file at `path`.
    pub fn file(&self, path: &str) -> Option<&TreeFile> {
        self.files
            .binary_search_by(|f| f.path.as_str().cmp(path))
            .ok()
            .map(|i| &self.files[i])
    }

    /// Total size of the tree's files.
    pub fn len(&self) -> u64 {
        self.files.iter().map(TreeFile::len).sum()
    }

    /// Whether the tree holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The canonical serialisation (what the id hashes). Layout in `docs/FORMAT.md`.
    pub fn encode(&self) -> Vec<u8> {
        encoding::encode(self)
    }

    /// Parses [`Self::encode`] output of any version this build reads.
    /// To read a large manifest without decoding it whole, use [`ManifestView`].
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        Ok(ManifestView::parse(bytes)?.to_manifest())
    }

    /// The manifest's id.
    pub fn id(&self) -> ObjectId {
        ObjectId::hash(&self.encode())
    }

    /// Paths valid, sorted and unique, no file inside another; sizes that fit; pairs that
    /// name tensors.
    fn check(&self) -> Result<(), FormatError> {
        let bad = |detail: String| Err(FormatError::invalid("manifest", detail));
        check_tree(self.files.iter().map(|f| f.path.as_str()))?;
        for f in &self.files {
            let mut total = 0u64;
            for r in &f.regions {
                if let Region::Tensor(e) = r {
                    if e.header.data_len().is_none() {
                        return bad(format!("{:?} size overflows", e.name));
                    }
                }
                total = match total.checked_add(r.len()) {
                    Some(t) => t,
                    None => return bad(format!("{:?} size overflows", f.path)),
                };
            }
            if f.format != FileFormat::Safetensors && !f.metadata.is_empty() {
                return bad(format!("{:?} has metadata but is not safetensors", f.path));
            }
        }
        let n = self.tensors().count() as u64;
        for p in &self.pairs {
            if [p.param, p.exp_avg, p.exp_avg_sq]
                .iter()
                .any(|&i| u64::from(i) >= n)
            {
                return bad(format!("moment pair names a tensor past the {n} there are"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
