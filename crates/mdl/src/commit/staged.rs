//! What a commit will store before it is stored: the input read in and checked, the moment
//! pairs the caller knows, and what the commit must wait for before it reads the bytes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::input::{Input, MemoryFile, Reading};
use crate::{Error, Result};

/// What a commit will store, read in and checked but not yet stored: files on disk mapped
/// into memory (a file deleted or renamed over afterwards is still read whole; one written in
/// place fails the commit, unless copied first), or files given as bytes. A
/// background commit ([`crate::background`]) is staged by the caller and stored on a thread
/// of its own.
pub struct Staged {
    pub(super) input: Input,
    /// The caller's moment pairs, as indices into the input's pieces.
    pub(super) client: Vec<(usize, usize, usize)>,
    pub(super) started: Instant,
    /// What the commit waits for before it reads a byte of the input (see [`Staged::after`]).
    pub(super) ready: Option<Ready>,
}

/// Waits until staged bytes have all arrived; says why not when they never will.
pub type Ready = Box<dyn FnOnce() -> std::result::Result<(), String> + Send>;

impl Staged {
    /// The files at `paths`: each a file (entered under its name) or a directory (its files
    /// entered under their relative paths).
    pub fn paths(paths: &[PathBuf]) -> Result<Staged> {
        Self::read(paths, Reading::default())
    }

    /// [`Staged::paths`], read as `reading` says. The files are read where they are: the
    /// commit fails, recording nothing, if one is written before it has read them.
    pub fn read(paths: &[PathBuf], reading: Reading) -> Result<Staged> {
        Self::open(paths, reading, None)
    }

    /// [`Staged::read`] from private copies of the files, made in the folder `copies` (on
    /// the repository's disk: `.mdl/incoming`) before this returns — a reflink where the
    /// filesystem has them, otherwise a copy — and removed when the commit is done: the
    /// caller may write the files again at once (a background commit's).
    pub fn copied(paths: &[PathBuf], reading: Reading, copies: &Path) -> Result<Staged> {
        Self::open(paths, reading, Some(copies))
    }

    fn open(paths: &[PathBuf], reading: Reading, copies: Option<&Path>) -> Result<Staged> {
        let started = Instant::now();
        let _phase = super::phase::Phase::start("open input");
        Ok(Staged {
            input: Input::open(paths, reading, copies)?,
            client: Vec::new(),
            started,
            ready: None,
        })
    }

    /// The same input, whose tensor bytes are still arriving (a device-to-host copy in
    /// flight): the commit calls `ready` before it reads any of them, and fails with its
    /// message, the repository untouched, when it says they never will. Only the files'
    /// headers are read before (when staged).
    pub fn after(mut self, ready: Ready) -> Staged {
        self.ready = Some(ready);
        self
    }

    /// Files given as bytes (a training process's live state, serialized in memory;
    /// safetensors files are split into tensors as from disk), with the moment pairs the
    /// caller knows. A pair naming a tensor the files do not hold is an error; a pair whose
    /// shapes disagree, or whose tensors the lossy codecs do not take, is not used.
    pub fn memory(files: Vec<MemoryFile>, pairs: &[KnownPair]) -> Result<Staged> {
        let started = Instant::now();
        let input = Input::from_memory(files)?;
        let index: HashMap<(&str, &str), usize> = input
            .pieces
            .iter()
            .enumerate()
            .filter(|(_, p)| p.tensor)
            .map(|(i, p)| ((input.files[p.file].tree_path.as_str(), p.name.as_str()), i))
            .collect();
        let find = |(file, name): &(String, String)| {
            index
                .get(&(file.as_str(), name.as_str()))
                .copied()
                .ok_or_else(|| Error::Input {
                    path: PathBuf::from(file),
                    source: std::io::Error::other(format!(
                        "a moment pair names {name:?}, not in it"
                    )),
                })
        };
        let client = pairs
            .iter()
            .map(|p| Ok((find(&p.param)?, find(&p.exp_avg)?, find(&p.exp_avg_sq)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Staged {
            input,
            client,
            started,
            ready: None,
        })
    }
}

/// A parameter and its Adam moments as the committer knows them, each `(file, tensor name)`:
/// the pairing the lossy codecs use for them, recorded as the client's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownPair {
    /// The parameter.
    pub param: (String, String),
    /// Its `exp_avg`.
    pub exp_avg: (String, String),
    /// Its `exp_avg_sq`.
    pub exp_avg_sq: (String, String),
}
