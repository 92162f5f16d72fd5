//! What a commit reads: a tree of files, each mapped into memory and cut into runs of bytes —
//! a safetensors file into its header and tensors, a `torch.save` archive into its storages
//! and the rest, any other file into plain bytes — and the pieces stored as objects, as bytes
//! or as float views.

use std::fs::File;
use std::path::{Path, PathBuf};

use mdl_codec::engine::{DeviceCopy, FloatView, Moments};
use mdl_format::safetensors::{self, SafetensorsError};
use mdl_format::{FileFormat, TensorHeader};

use crate::{Error, Result};
use parts::{Buffer, Parts};

mod parts;
mod split;
mod stamp;
mod trainer;
mod walk;

pub use walk::{files as tree_files, Found as SourceFile};

/// Runs of bytes up to this length are kept in the manifest itself.
pub(crate) const INLINE_MAX: u64 = 4096;

/// Longer runs of bytes are stored as objects of at most this length.
pub(crate) const BYTES_OBJECT_MAX: u64 = 64 << 20;

/// One file of the tree.
pub(crate) struct InputFile {
    /// Its path in the tree.
    pub(crate) tree_path: String,
    /// Where it was read from.
    pub(crate) source: PathBuf,
    pub(crate) executable: bool,
    pub(crate) format: FileFormat,
    /// Why a file that looked splittable is stored as bytes.
    pub(crate) note: String,
    /// A safetensors file's `__metadata__`, sorted by key.
    pub(crate) metadata: Vec<(String, String)>,
    /// Its runs, in file order.
    pub(crate) runs: Vec<Run>,
    /// A safetensors file's header length; 0 for other files.
    pub(crate) header_len: u64,
    data: Data,
    /// A run of its bytes that also lies on a GPU.
    device: Option<OnDevice>,
}

/// Where a file's bytes are.
enum Data {
    /// No bytes, given as such.
    Empty,
    /// A file on disk (not empty): mapped, and open to be read by copying.
    Disk {
        map: memmap2::Mmap,
        file: File,
        /// Its stamp when opened, checked once the commit has read it; none for a private
        /// copy, which nobody else writes.
        stamp: Option<stamp::Stamp>,
        /// The private copy mapped, removed when the input is dropped.
        _copy: Option<tempfile::TempPath>,
    },
    /// A small file on disk, read whole (and closed) under its stamp.
    Read { bytes: Vec<u8>, stamp: stamp::Stamp },
    /// Bytes a caller handed over (a live state serialized in memory).
    Owned(Buffer),
    /// A safetensors file a caller handed over in parts (see [`MemoryFile::in_parts`]).
    Parts(Parts),
}

impl Data {
    /// `e`, a failure to read or parse the file at `path`; or, where the file is read in
    /// place and is being written (its stamp moves within a clock tick or two of the
    /// failure), that: the cause of `e`, most likely — a file cut short or half rewritten.
    fn explain(&self, path: &Path, e: Error) -> Error {
        match self {
            Data::Disk {
                file,
                stamp: Some(stamp),
                ..
            } => stamp.explain(file, path, e),
            // Closed since: what is at its path now tells whether it was being written.
            Data::Read { stamp, .. } => {
                stamp::wait_a_tick(stamp);
                match std::fs::metadata(path) {
                    Ok(m) if stamp::Stamp::from(&m) == *stamp => e,
                    _ => Error::Changed {
                        path: path.to_path_buf(),
                    },
                }
            }
            _ => e,
        }
    }

    /// The whole file, or of a file in parts its first part.
    fn head(&self) -> &[u8] {
        match self {
            Data::Empty => &[],
            Data::Disk { map, .. } => map,
            Data::Read { bytes, .. } => bytes,
            Data::Owned(v) => (**v).as_ref(),
            Data::Parts(p) => p.head(),
        }
    }

    fn len(&self) -> u64 {
        match self {
            Data::Parts(p) => p.len(),
            _ => self.head().len() as u64,
        }
    }

    /// Bytes `start..start + len`, which lie in one part (checked when the file was cut).
    fn range(&self, start: u64, len: u64) -> &[u8] {
        match self {
            Data::Parts(p) => p
                .get(start, len)
                .expect("runs of a file in parts lie within a part"),
            _ => &self.head()[start as usize..(start + len) as usize],
        }
    }
}

/// A file given as bytes: its path in the tree and its content.
pub struct MemoryFile {
    /// Its path in the tree (`/`-separated, relative).
    pub path: String,
    /// Its bytes (a safetensors file is split into tensors as from disk).
    given: Given,
    /// Where a run of its bytes also lies on a GPU (see [`MemoryFile::on_device`]).
    pub device: Option<OnDevice>,
}

/// How a [`MemoryFile`]'s bytes were given.
enum Given {
    /// In one buffer, unchanged until the commit is done: read where it lies.
    Whole(Buffer),
    /// In parts that their owner may change meanwhile: each tensor is copied before the
    /// commit reads it.
    Parts(Parts),
}

/// A run of a file's bytes, `start..start + len`, with a copy in a GPU's memory: a training
/// process's CUDA tensors, snapshotted on their device. A GPU engine on that device computes
/// on that copy instead of copying the bytes over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnDevice {
    /// The run's first byte in the file.
    pub start: usize,
    /// Its length.
    pub len: usize,
    /// Where its copy is.
    pub copy: DeviceCopy,
}

impl MemoryFile {
    /// The file at `path` holding `bytes`: any owned buffer, so a caller's own memory (a
    /// Python package's staging buffer) is read where it lies. It must not change until the
    /// commit reading it is done.
    pub fn new(path: impl Into<String>, bytes: impl AsRef<[u8]> + Send + Sync + 'static) -> Self {
        MemoryFile {
            path: path.into(),
            given: Given::Whole(Box::new(bytes)),
            device: None,
        }
    }

    /// The safetensors file at `path` made of `parts` one after another: its header (the
    /// first part) and each tensor's bytes in parts of their own, which may be the caller's
    /// live tensors — no copy of the whole file is made. They may change while the commit
    /// runs (another thread training on): each tensor is copied once before it is hashed and
    /// coded, so what is recorded is what was read. A file that is not safetensors, or whose
    /// header or a tensor spans two parts, is refused.
    pub fn in_parts(
        path: impl Into<String>,
        parts: Vec<Box<dyn AsRef<[u8]> + Send + Sync>>,
    ) -> Self {
        MemoryFile {
            path: path.into(),
            given: Given::Parts(Parts::new(parts)),
            device: None,
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        match &self.given {
            Given::Whole(b) => (**b).as_ref().len() as u64,
            Given::Parts(p) => p.len(),
        }
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The same file, a run of whose bytes also lies on a GPU, unchanged until the commit
    /// reading the file is done. A run outside the file is an error.
    pub fn on_device(mut self, run: OnDevice) -> Result<Self> {
        if run
            .start
            .checked_add(run.len)
            .is_none_or(|end| end as u64 > self.len())
        {
            return Err(Error::Input {
                path: PathBuf::from(&self.path),
                source: std::io::Error::other(format!(
                    "a device copy of bytes {}..+{} lies outside its {} bytes",
                    run.start,
                    run.len,
                    self.len()
                )),
            });
        }
        self.device = Some(run);
        Ok(self)
    }
}

/// A run of a file's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Run {
    /// Kept in the manifest: `start..start + len` of the file.
    Inline { start: u64, len: u64 },
    /// Stored as an object: index into [`Input::pieces`].
    Object(usize),
}

/// A run stored as an object: a tensor, or bytes (a `u8` tensor of shape `[len]`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Piece {
    /// Index of its file in [`Input::files`].
    pub(crate) file: usize,
    /// A tensor's name in its file; for bytes, `path@offset` (messages only).
    pub(crate) name: String,
    pub(crate) header: TensorHeader,
    /// Its first byte in the file.
    pub(crate) offset: u64,
    pub(crate) len: u64,
    /// A tensor (not bytes).
    pub(crate) tensor: bool,
}

/// How a commit reads files from disk; the defaults refuse what a user would not mean to
/// commit.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reading {
    /// Follow symlinks in a folder that point outside it (refused by default: a link to a
    /// credentials file would be committed and pushed).
    pub follow_links: bool,
    /// Store a file that looks like a checkpoint but does not parse as bytes (refused by
    /// default, naming what is wrong).
    pub as_bytes: bool,
}

/// The tree a commit reads; nothing is written anywhere.
pub(crate) struct Input {
    pub(crate) files: Vec<InputFile>,
    /// Every run stored as an object, file by file in tree order.
    pub(crate) pieces: Vec<Piece>,
}

impl Input {
    /// Reads the files under `paths` (see [`walk::files`]) and splits each: in place, or,
    /// with `copies`, from private copies made there before this returns (see [`hold`]).
    pub(crate) fn open(
        paths: &[PathBuf],
        reading: Reading,
        copies: Option<&Path>,
    ) -> Result<Input> {
        let found = walk::files(paths, reading.follow_links)?;
        Self::open_found(found, reading.as_bytes, copies)
    }

    /// Reads the one file at `source`, entered under `tree_path`.
    pub(crate) fn open_as(source: &Path, tree_path: &str, as_bytes: bool) -> Result<Input> {
        mdl_format::check_path(tree_path).map_err(|e| Error::Input {
            path: source.to_path_buf(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let found = walk::Found {
            tree_path: tree_path.to_string(),
            source: source.to_path_buf(),
            executable: false,
        };
        Self::open_found(vec![found], as_bytes, None)
    }

    /// The tree of `files`, given as bytes (checked like paths from disk: valid and unique).
    pub(crate) fn from_memory(files: Vec<MemoryFile>) -> Result<Input> {
        let mut files = files;
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let refuse = |path: &str, why: String| Error::Input {
            path: PathBuf::from(path),
            source: std::io::Error::other(why),
        };
        for (i, f) in files.iter().enumerate() {
            mdl_format::check_path(&f.path).map_err(|e| refuse(&f.path, e.to_string()))?;
            if i > 0 && files[i - 1].path == f.path {
                return Err(refuse(&f.path, "given twice".into()));
            }
        }
        let found = files
            .into_iter()
            .map(|f| {
                let empty = f.is_empty();
                let data = match f.given {
                    _ if empty => Data::Empty,
                    Given::Whole(b) => Data::Owned(b),
                    Given::Parts(p) => Data::Parts(p),
                };
                let found = walk::Found {
                    source: PathBuf::from(&f.path),
                    tree_path: f.path,
                    executable: false,
                };
                (found, data, f.device)
            })
            .collect();
        Self::open_data(found, false)
    }

    fn open_found(found: Vec<walk::Found>, as_bytes: bool, copies: Option<&Path>) -> Result<Input> {
        // Every file is stamped before a byte of any is read; none is kept open meanwhile, so
        // a tree of more files than the process may open at once commits.
        let stamped = found
            .into_iter()
            .map(|f| {
                let (_, stamp) = open_file(&f.source)?;
                Ok((f, stamp))
            })
            .collect::<Result<Vec<_>>>()?;
        stamp::settle(stamped.iter().map(|(_, s)| s));
        let mut whole = READ_WHOLE_TOTAL;
        let found = stamped
            .into_iter()
            .map(|(f, stamp)| {
                let data = hold(&f.source, stamp, copies, &mut whole)?;
                Ok((f, data, None))
            })
            .collect::<Result<Vec<_>>>()?;
        Self::open_data(found, as_bytes)
    }

    /// An error unless every file read in place is as it was when opened: called once the
    /// commit has read them all, before it records anything.
    pub(crate) fn check_unchanged(&self) -> Result<()> {
        for f in &self.files {
            if let Data::Disk {
                file,
                stamp: Some(stamp),
                ..
            } = &f.data
            {
                stamp.check(file, &f.source)?;
            }
        }
        Ok(())
    }

    fn open_data(
        found: Vec<(walk::Found, Data, Option<OnDevice>)>,
        as_bytes: bool,
    ) -> Result<Input> {
        let mut input = Input {
            files: Vec::with_capacity(found.len()),
            pieces: Vec::new(),
        };
        for (f, data, device) in found {
            let cut = split::cut(&f.source, &f.tree_path, data.head(), data.len(), as_bytes)
                .map_err(|e| data.explain(&f.source, e))?;
            if let Data::Parts(parts) = &data {
                let runs = cut.runs.iter().map(|run| match run {
                    split::Cut::Inline { start, len } => (*start, *len),
                    split::Cut::Object { header, offset, .. } => {
                        (*offset, header.data_len().expect("checked when cut"))
                    }
                });
                parts.check(&f.tree_path, runs)?;
            }
            let index = input.files.len();
            let mut runs = Vec::with_capacity(cut.runs.len());
            for run in cut.runs {
                runs.push(match run {
                    split::Cut::Inline { start, len } => Run::Inline { start, len },
                    split::Cut::Object {
                        name,
                        header,
                        offset,
                        tensor,
                    } => {
                        if tensor {
                            mdl_format::check_tensor_name(&name).map_err(|e| Error::Input {
                                path: f.source.clone(),
                                source: std::io::Error::other(format!(
                                    "{e} (a tensor no request could name by itself; rename it)"
                                )),
                            })?;
                        }
                        let len = header.data_len().expect("checked when cut");
                        input.pieces.push(Piece {
                            file: index,
                            name,
                            header,
                            offset,
                            len,
                            tensor,
                        });
                        Run::Object(input.pieces.len() - 1)
                    }
                });
            }
            input.files.push(InputFile {
                tree_path: f.tree_path,
                source: f.source,
                executable: f.executable,
                format: cut.format,
                note: cut.note,
                metadata: cut.metadata,
                runs,
                header_len: cut.header_len,
                data,
                device,
            });
        }
        Ok(input)
    }

    /// Total size of the tree's files.
    pub(crate) fn len(&self) -> u64 {
        self.files.iter().map(|f| f.len()).sum()
    }

    /// The one path the tree was read from, when it is a single file (what `--eval-cmd` reads
    /// for the committed checkpoint itself).
    pub(crate) fn single_file(&self) -> Option<&Path> {
        match self.files.as_slice() {
            [f] => Some(&f.source),
            _ => None,
        }
    }

    /// The runs of the files' bytes that also lie on a GPU, with where.
    pub(crate) fn device_copies(&self) -> impl Iterator<Item = (&[u8], DeviceCopy)> {
        self.files.iter().filter_map(|f| {
            let run = f.device?;
            Some((f.range(run.start as u64, run.len as u64), run.copy))
        })
    }

    /// Whether piece `i`'s bytes lie in a run that is also on a GPU. The caller keeps such
    /// bytes unchanged until the commit is done, so they are read in place, not copied.
    pub(crate) fn on_device(&self, i: usize) -> bool {
        let p = &self.pieces[i];
        self.files[p.file].device.is_some_and(|run| {
            run.start as u64 <= p.offset && p.offset + p.len <= (run.start + run.len) as u64
        })
    }

    /// Whether piece `i`'s bytes stay as they are while the commit runs: bytes the input owns
    /// (a caller's buffer, a small file read whole) or that also lie on a GPU (the caller
    /// keeps them). A mapped file's bytes are another process's to change, and a file given
    /// in parts its owner's.
    pub(crate) fn is_stable(&self, i: usize) -> bool {
        let data = &self.files[self.pieces[i].file].data;
        !matches!(data, Data::Disk { .. } | Data::Parts(_)) || self.on_device(i)
    }

    /// Piece `i`'s bytes.
    pub(crate) fn tensor(&self, i: usize) -> &[u8] {
        let p = &self.pieces[i];
        self.files[p.file].range(p.offset, p.len)
    }

    /// Copies bytes `at..at + buf.len()` of piece `i` into `buf`: read from the file (one
    /// copy, and no page faults, where the mapping would cost both), or from memory.
    pub(crate) fn read_into(&self, i: usize, at: u64, buf: &mut [u8]) -> Result<()> {
        let p = &self.pieces[i];
        let f = &self.files[p.file];
        match &f.data {
            Data::Disk { file, .. } => {
                use std::os::unix::fs::FileExt;
                file.read_exact_at(buf, p.offset + at).map_err(|source| {
                    let e = Error::Input {
                        path: f.source.clone(),
                        source,
                    };
                    f.data.explain(&f.source, e)
                })
            }
            _ => {
                let at = at as usize;
                buf.copy_from_slice(&self.tensor(i)[at..at + buf.len()]);
                Ok(())
            }
        }
    }

    /// Piece `i` as floats (a lossy candidate: bf16, f16 or f32).
    pub(crate) fn view(&self, i: usize) -> FloatView<'_> {
        FloatView {
            dtype: self.pieces[i].header.dtype,
            bytes: self.tensor(i),
        }
    }

    /// The moments at piece indices `(exp_avg, exp_avg_sq)`.
    pub(crate) fn moments(&self, pair: Option<(usize, usize)>) -> Option<Moments<'_>> {
        pair.map(|(m, v)| Moments {
            m: self.view(m),
            v: self.view(v),
        })
    }

    /// A number from the checkpoint's metadata: the first safetensors file's `__metadata__`
    /// that has `key`.
    pub(crate) fn metadata_value<T: std::str::FromStr>(&self, key: &str) -> Option<T> {
        self.files
            .iter()
            .flat_map(|f| f.metadata.iter())
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| v.trim().parse().ok())
    }

    /// Drops the pages of piece `i` from this process's memory (they stay in the page cache),
    /// so resident memory follows the piece being worked on, not the tree's size.
    pub(crate) fn release(&self, i: usize) {
        let p = &self.pieces[i];
        let Data::Disk { map, .. } = &self.files[p.file].data else {
            return;
        };
        let start = p.offset as usize;
        let page = 4096;
        let aligned = start.div_ceil(page) * page;
        let end = (start + p.len as usize) / page * page;
        if end > aligned {
            // SAFETY: the mapping is a read-only private file mapping that this process never
            // writes, so discarding its pages only means they are read from the file again on
            // the next access; no slice into the range is used concurrently in a way that
            // depends on the pages staying resident.
            #[allow(unsafe_code)]
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    aligned,
                    end - aligned,
                )
            };
        }
    }
}

impl InputFile {
    /// The whole file; of a safetensors file given in parts, its header.
    pub(crate) fn head(&self) -> &[u8] {
        self.data.head()
    }

    /// Bytes `start..start + len`: a run or a piece of the file (or within one).
    pub(crate) fn range(&self, start: u64, len: u64) -> &[u8] {
        self.data.range(start, len)
    }

    /// The file's bytes, a part at a time, with where each starts.
    pub(crate) fn parts(&self) -> Box<dyn Iterator<Item = (u64, &[u8])> + '_> {
        match &self.data {
            Data::Parts(p) => Box::new(p.iter()),
            d => Box::new(std::iter::once((0, d.head()))),
        }
    }

    /// Its size.
    pub(crate) fn len(&self) -> u64 {
        self.data.len()
    }
}

/// `path` opened for reading, and its stamp; an error unless it is a regular file.
fn open_file(path: &Path) -> Result<(File, stamp::Stamp)> {
    let io = |source| Error::Input {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(io(std::io::Error::other("not a regular file")));
    }
    let stamp = stamp::Stamp::from(&meta);
    if stamp.len() == 0 {
        // A file whose size says nothing of its bytes (/proc, /sys) would commit as empty.
        use std::os::unix::fs::FileExt;
        if file.read_at(&mut [0u8; 1], 0).map_err(io)? > 0 {
            return Err(io(std::io::Error::other(
                "its size says 0 bytes but it reads more (a /proc or /sys file): copy it to a \
                 regular file to commit it",
            )));
        }
    }
    Ok((file, stamp))
}

/// Files of at most this many bytes are read into memory whole (and closed) rather than
/// mapped and kept open, while the bytes so read stay within [`READ_WHOLE_TOTAL`]: a tree of
/// many small files (a tokenizer's, a dataset's) holds neither a descriptor nor a mapping per
/// file, either of which a process has a limit of (`ulimit -n`, `vm.max_map_count`).
const READ_WHOLE_MAX: u64 = 1 << 20;

/// What one commit reads into memory whole, all files together (see [`READ_WHOLE_MAX`]).
const READ_WHOLE_TOTAL: u64 = 256 << 20;

/// The bytes of the file at `path`, stamped `stamp` when first opened (before [`settle`]):
/// read whole into memory where small and `whole` (bytes left to read so) allows, otherwise
/// mapped read-only — the file itself, or with `copies` a private copy made in that folder (a
/// reflink where the filesystem has them, otherwise a copy in the kernel). Either is checked
/// against the stamp once made. A file replaced since it was stamped (a new inode, renamed
/// into place) is taken as it is now, after a clock tick of settling; one written in place
/// since (the same inode, another stamp) is refused as changed.
///
/// [`settle`]: stamp::settle
fn hold(path: &Path, stamp: stamp::Stamp, copies: Option<&Path>, whole: &mut u64) -> Result<Data> {
    let io = |source| Error::Input {
        path: path.to_path_buf(),
        source,
    };
    let (file, now) = open_file(path)?;
    let stamp = if now == stamp {
        stamp
    } else if now.same_file(&stamp) {
        // Written in place since it was stamped (cut short by a writer opening it "wb",
        // or overwritten): being written, not yet the file the user meant.
        return Err(Error::Changed {
            path: path.to_path_buf(),
        });
    } else {
        stamp::wait_a_tick(&now);
        now
    };
    // The length read or mapped is the stamp's: a file read in place is checked against it
    // first, a copy once made.
    let len = stamp.len();
    if len <= READ_WHOLE_MAX && len <= *whole {
        use std::os::unix::fs::FileExt;
        let mut bytes = vec![0; len as usize];
        file.read_exact_at(&mut bytes, 0)
            .map_err(|e| stamp.explain(&file, path, io(e)))?;
        stamp.check(&file, path)?;
        *whole -= len;
        return Ok(Data::Read { bytes, stamp });
    }
    let (file, stamp, copy) = match copies {
        None => {
            stamp.check(&file, path)?;
            (file, Some(stamp), None)
        }
        Some(dir) => {
            let mut tmp = mdl_store::incoming_file_in(dir, ".snapshot-")?;
            let copied = std::io::copy(&mut &file, tmp.as_file_mut()).map_err(io)?;
            stamp.check(&file, path)?;
            if copied != len {
                return Err(Error::Changed {
                    path: path.to_path_buf(),
                });
            }
            let (copy, kept) = tmp.into_parts();
            (copy, None, Some(kept))
        }
    };
    // SAFETY: the map is read-only and private. Another process truncating the file while
    // it is mapped would fault (SIGBUS; the CLI reports it in one line, see its main.rs): a
    // private copy is never written, and a file read in place is stamped, so that one
    // rewritten in place is refused (`check_unchanged`) rather than recorded.
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    Ok(Data::Disk {
        map,
        file,
        stamp,
        _copy: copy,
    })
}

/// The layout of a safetensors file of `len` bytes, checked, from its first bytes `head`
/// (the whole file, or at least its header).
fn safetensors_layout(
    head: &[u8],
    len: u64,
) -> std::result::Result<safetensors::Layout, SafetensorsError> {
    if len < 8 || head.len() < 8 {
        return Err(SafetensorsError::TooShort { len });
    }
    let header_len = safetensors::header_len(&head[..8], len)?;
    let Some(header) = head.get(8..8 + header_len as usize) else {
        return Err(SafetensorsError::TooShort {
            len: head.len() as u64,
        });
    };
    safetensors::parse(header, len)
}
