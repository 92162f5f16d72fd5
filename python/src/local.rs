//! A repository on this machine or in object storage: commits (staged here, stored in the
//! background through the operations interface, `mdl_ops::Operations::commit_staged`), tensor
//! reads and the refs they need. Each call opens the repository for itself (reads share it,
//! commits own it while they store, and their deferred re-encodes right after, which stop for
//! any other writer), so a training process holds no lock between commits; for
//! object storage each call works on this machine's replica, synced first and published after
//! a change.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mdl::background::{Committer, Handle};
use mdl::checkout::{Layout, Placed};
use mdl::commit::{
    CommitOptions, CommitOutcome, DeviceCopy, KnownPair, MemoryFile, OnDevice, Staged,
};
use mdl::engine::{Selected, Side};
use mdl::warm::DEFAULT_WARM_BYTES;
use mdl::{LockMode, NoProgress, OpenOptions, Repository};
use mdl_bucket::{Location, Publish, Replica};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyList};

use crate::errors::released;
use crate::staging::{Exported, Part};
use crate::{error, report};

/// A repository, by its work directory.
#[pyclass(frozen, module = "mdl._mdl")]
pub struct Repo {
    opener: Opener,
    committer: Committer,
}

/// A commit stored in the background.
#[pyclass(frozen, module = "mdl._mdl")]
pub struct Pending(Handle);

/// What one opening of the repository needs.
#[derive(Clone)]
struct Opener {
    at: At,
    wait: Duration,
    /// The repository through the operations interface: what stores the commits.
    ops: Arc<dyn mdl_ops::Operations>,
}

/// Where the repository is.
#[derive(Clone)]
enum At {
    /// A work directory on this machine.
    Disk(PathBuf),
    /// A repository in object storage: each call works on this machine's replica, brought up
    /// to date first, and what a change did is published before it returns (as the CLI's
    /// `-C s3://…` does).
    Bucket(Location),
}

impl At {
    /// Where the repository at `location` is: its work directory (the folder or its nearest
    /// ancestor holding `.mdl`), or object storage. A served repository has no native handle:
    /// `ops::Ops` alone reaches it.
    fn of(location: mdl_ops::Location) -> PyResult<At> {
        match location {
            mdl_ops::Location::Folder(dir) => mdl::discover(&dir)
                .map(At::Disk)
                .ok_or_else(|| error(mdl::StoreError::NotARepository(dir))),
            mdl_ops::Location::Bucket(loc) => Ok(At::Bucket(loc)),
            mdl_ops::Location::Served(url) => Err(error(format!(
                "{url} is served: mdl.open(url) reaches it over HTTP"
            ))),
        }
    }
}

/// How this process reaches a repository: waiting `wait` for another process holding it,
/// and opening a folder that `mdl serve` serves here (the server holds the lock only while it
/// changes the repository).
fn access(wait: Duration) -> mdl_ops::Access {
    mdl_ops::Access {
        token: None,
        wait,
        purpose: format!("python (pid {})", std::process::id()),
        follow_server: false,
        verbose: false,
        lent: mdl::Lent::default(),
    }
}

impl Opener {
    fn new(at: At, wait: Duration) -> Opener {
        let ops: Arc<dyn mdl_ops::Operations> = match &at {
            At::Disk(root) => Arc::new(mdl_ops::Local::new(root.clone(), access(wait))),
            At::Bucket(loc) => Arc::new(mdl_ops::InBucket::new(loc.clone(), access(wait))),
        };
        Opener { at, wait, ops }
    }

    fn open(&self, root: &Path, mode: LockMode) -> mdl::Result<Repository> {
        let opts = OpenOptions {
            mode,
            wait: self.wait,
            purpose: access(self.wait).purpose,
            ..OpenOptions::default()
        };
        Repository::open(root, &opts)
    }

    /// This machine's replica of `loc`, brought up to date.
    fn replica(&self, loc: &Location) -> mdl_bucket::Result<Replica> {
        Replica::open(loc, &mdl_bucket::cache_root(), self.wait)
    }

    /// Runs `f` on the repository opened with `mode`; for a bucket, what a change did is
    /// published after.
    fn run<T>(
        &self,
        mode: LockMode,
        f: impl FnOnce(&Repository) -> mdl::Result<T>,
    ) -> mdl_bucket::Result<T> {
        match &self.at {
            At::Disk(root) => Ok(f(&self.open(root, mode)?)?),
            At::Bucket(loc) => {
                let mut replica = self.replica(loc)?;
                let repo = replica.repository(self.wait)?;
                let out = f(&repo)?;
                let how = match mode {
                    LockMode::Write => Publish::Replaying,
                    _ => Publish::Nothing,
                };
                replica.finish(&repo, how)?;
                Ok(out)
            }
        }
    }

    /// Stores one staged commit through the operations interface (for a bucket, published
    /// before it returns: a commit replayed onto another writer's tip reports its new id).
    fn store(
        &self,
        staged: Staged,
        opts: &CommitOptions,
    ) -> Result<CommitOutcome, mdl::background::Failure> {
        self.ops
            .commit_staged(staged, opts, None, &NoProgress)
            .map_err(mdl::background::failure)
    }
}

impl Repo {
    fn new(at: At, wait: Duration, warm_bytes: u64) -> Repo {
        let opener = Opener::new(at, wait);
        let for_commits = opener.clone();
        let mut committer = Committer::storing(
            move |staged, opts| for_commits.store(staged, opts),
            warm_bytes,
        );
        // A repository on disk gets its deferred re-encodes (`delta.defer`) worked after each
        // commit; a replica of a bucket's never defers one (its records are the bucket's).
        if let At::Disk(root) = &opener.at {
            // Another writer at work: the queue waits for the next turn rather than the thread
            // (and the next commit) for it.
            let deferred = mdl_ops::Local::new(root.clone(), access(Duration::from_secs(1)));
            committer = committer.working_deferred(move || deferred.writer());
        }
        Repo { opener, committer }
    }

    /// Runs `f` on the repository opened with `mode`, the interpreter released.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        mode: LockMode,
        f: impl FnOnce(&Repository) -> mdl::Result<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| self.opener.run(mode, f)).map_err(error)
    }

    /// Reads with the interpreter released.
    fn read<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Repository) -> mdl::Result<T> + Send,
    ) -> PyResult<T> {
        self.with(py, LockMode::Read, f)
    }

    /// Changes refs with the interpreter released.
    fn change<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Repository) -> mdl::Result<T> + Send,
    ) -> PyResult<T> {
        self.with(py, LockMode::Write, f)
    }

    /// The repository opened for reading, with its codec engine chosen as a checkout's is
    /// (the `engine` setting, default `auto`: what decodes, onto a GPU in place where that
    /// engine is one), and `rev`'s layout (what reads of bytes decode from).
    fn laid_out(&self, py: Python<'_>, rev: &str) -> PyResult<(Repository, Layout, Selected)> {
        py.detach(|| {
            let mut repo = match &self.opener.at {
                At::Disk(root) => self.opener.open(root, LockMode::Read)?,
                At::Bucket(loc) => {
                    let replica = self.opener.replica(loc)?;
                    replica.repository(self.opener.wait)?
                }
            };
            let selected = mdl::engine::select(&repo, None)?;
            repo.set_engine(selected.engine.clone());
            let layout = mdl::checkout::layout(&repo, rev)?;
            Ok::<_, mdl_bucket::Error>((repo, layout, selected))
        })
        .map_err(error)
    }

    fn submit(&self, py: Python<'_>, staged: Staged, opts: CommitOptions) -> PyResult<Pending> {
        py.detach(|| self.committer.submit(staged, opts))
            .map(Pending)
            .map_err(error)
    }
}

/// A commit's options as the Python side passes them: a dict with these keys.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct Options {
    message: String,
    branch: Option<String>,
    step: Option<u64>,
    metrics: Vec<(String, f64)>,
    /// True: lossy; False: lossless; None: the repository's setting.
    lossy: Option<bool>,
    epsilon: Option<f64>,
    author: Option<String>,
    /// Follow symlinks that point out of a folder committed.
    #[pyo3(default)]
    follow_links: bool,
    /// Store a file that looks like a checkpoint but does not parse as bytes.
    #[pyo3(default)]
    as_bytes: bool,
    /// The training code's folder, whose git commit is recorded.
    #[pyo3(default)]
    source: Option<PathBuf>,
    /// The branch is a tool's working branch (a sharded save's part): HEAD never follows it.
    #[pyo3(default)]
    working: bool,
}

impl Options {
    /// The library's commit options.
    pub(crate) fn commit(self) -> PyResult<CommitOptions> {
        use mdl::lossy::CodecMode;
        Ok(CommitOptions {
            message: self.message,
            branch: self
                .branch
                .as_deref()
                .map(mdl::RefName::new)
                .transpose()
                .map_err(error)?,
            step: self.step,
            metrics: self.metrics,
            author: self.author,
            lossy: mdl::lossy::LossyRequest {
                mode: self.lossy.map(|l| {
                    if l {
                        CodecMode::Lossy
                    } else {
                        CodecMode::Lossless
                    }
                }),
                epsilon: self.epsilon,
                ..Default::default()
            },
            reading: mdl::commit::Reading {
                follow_links: self.follow_links,
                as_bytes: self.as_bytes,
            },
            source: self.source,
            working: self.working,
            ..Default::default()
        })
    }
}

#[pymethods]
impl Repo {
    /// Creates a repository in `path` (created if missing), or in object storage
    /// (`s3://BUCKET/PREFIX`).
    #[staticmethod]
    #[pyo3(signature = (path, wait = 60.0, warm_bytes = DEFAULT_WARM_BYTES))]
    #[allow(clippy::result_large_err)] // `released` boxes the closure's error
    fn init(py: Python<'_>, path: PathBuf, wait: f64, warm_bytes: u64) -> PyResult<Repo> {
        let wait = secs(wait)?;
        let location = mdl_ops::Location::parse(&path).map_err(error)?;
        released(py, || mdl_ops::init(&location, &mdl_ops::Access::default()))?;
        Ok(Repo::new(At::of(location)?, wait, warm_bytes))
    }

    /// Opens the repository at `path` or its nearest ancestor with `.mdl`, or in object
    /// storage (`s3://BUCKET/PREFIX`: this machine's replica is brought up to date).
    #[staticmethod]
    #[pyo3(signature = (path, wait = 60.0, warm_bytes = DEFAULT_WARM_BYTES))]
    fn open(py: Python<'_>, path: PathBuf, wait: f64, warm_bytes: u64) -> PyResult<Repo> {
        let wait = secs(wait)?;
        let at = At::of(mdl_ops::Location::parse(&path).map_err(error)?)?;
        if let At::Bucket(loc) = &at {
            py.detach(|| Replica::open(loc, &mdl_bucket::cache_root(), wait))
                .map_err(error)?;
        }
        Ok(Repo::new(at, wait, warm_bytes))
    }

    /// The work directory (for a repository in object storage, this machine's replica).
    #[getter]
    fn root(&self) -> PathBuf {
        match &self.opener.at {
            At::Disk(root) => root.clone(),
            At::Bucket(loc) => Replica::root_of(loc, &mdl_bucket::cache_root()),
        }
    }

    /// The repository's `s3://` URL, or None for one on this machine.
    #[getter]
    fn location(&self) -> Option<String> {
        match &self.opener.at {
            At::Disk(_) => None,
            At::Bucket(loc) => Some(loc.url()),
        }
    }

    /// Stages the files or directories at `paths` and commits them in the background. With
    /// `copy` they are copied before this returns (into the repository's `.mdl/incoming`, a
    /// reflink where the filesystem has them), so the caller may write or delete them at
    /// once; otherwise they are read in place, and one written meanwhile fails the commit.
    #[pyo3(signature = (paths, options, copy = true))]
    fn submit_paths(
        &self,
        py: Python<'_>,
        paths: Vec<PathBuf>,
        options: Options,
        copy: bool,
    ) -> PyResult<Pending> {
        let opts = options.commit()?;
        let reading = opts.reading;
        if !copy {
            let staged = py.detach(|| Staged::read(&paths, reading)).map_err(error)?;
            return self.submit(py, staged, opts);
        }
        // Beside a bucket's replica, not in it: the replica may not exist yet.
        let copies = match &self.opener.at {
            At::Disk(root) => Repository::incoming_of(root),
            At::Bucket(loc) => {
                Replica::root_of(loc, &mdl_bucket::cache_root()).with_file_name("incoming")
            }
        };
        let staged = py
            .detach(|| Staged::copied(&paths, reading, &copies))
            .map_err(error)?;
        self.submit(py, staged, opts)
    }

    /// Commits files given as `(path, buffer)` in the background, reading each buffer in
    /// place (it must not change until the commit is done), or as `(path, [buffer, ...])`, a
    /// safetensors file in parts (its header, then each tensor: the caller's own tensors,
    /// each copied once as the commit reaches it), with the moment pairs `pairs`:
    /// `((file, param), (file, exp_avg), (file, exp_avg_sq))`. The buffers' tensor bytes may
    /// still be arriving (copies from the GPU): the commit first calls `synchronize()` on each
    /// object of `ready` (CUDA events), and fails, storing nothing, if one raises. `on_gpu`:
    /// `(path, start, length, device index, address)` for each file a run of whose bytes is
    /// also on a GPU (a device snapshot, unchanged until the commit is done), which a GPU
    /// engine on that device reads there.
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    #[pyo3(signature = (files, pairs, options, ready = Vec::new(), on_gpu = Vec::new()))]
    fn submit_buffers(
        &self,
        py: Python<'_>,
        files: Vec<(String, Bound<'_, PyAny>)>,
        pairs: Vec<((String, String), (String, String), (String, String))>,
        options: Options,
        ready: Vec<Py<PyAny>>,
        on_gpu: Vec<(String, usize, usize, usize, u64)>,
    ) -> PyResult<Pending> {
        let opts = options.commit()?;
        let files = files
            .iter()
            .map(|(path, obj)| {
                let file = match obj.cast::<PyList>() {
                    Ok(parts) => {
                        let parts = parts
                            .iter()
                            .map(|p| Ok(Box::new(Exported::new(&p)?) as Part))
                            .collect::<PyResult<Vec<_>>>()?;
                        MemoryFile::in_parts(path.clone(), parts)
                    }
                    Err(_) => MemoryFile::new(path.clone(), Exported::new(obj)?),
                };
                match on_gpu.iter().find(|g| &g.0 == path) {
                    Some(&(_, start, len, ordinal, address)) => {
                        let copy = DeviceCopy { ordinal, address };
                        file.on_device(OnDevice { start, len, copy }).map_err(error)
                    }
                    None => Ok(file),
                }
            })
            .collect::<PyResult<Vec<_>>>()?;
        let pairs: Vec<KnownPair> = pairs
            .into_iter()
            .map(|(param, exp_avg, exp_avg_sq)| KnownPair {
                param,
                exp_avg,
                exp_avg_sq,
            })
            .collect();
        let mut staged = py.detach(|| Staged::memory(files, &pairs)).map_err(error)?;
        if !ready.is_empty() {
            staged = staged.after(Box::new(move || {
                Python::attach(|py| {
                    for event in ready {
                        event
                            .call_method0(py, "synchronize")
                            .map_err(|e| format!("the copy from the GPU did not complete: {e}"))?;
                    }
                    Ok(())
                })
            }));
        }
        self.submit(py, staged, opts)
    }

    /// Commits the union of the trees of commits `parts` (revisions) as one commit, nothing
    /// re-encoded (`mdl.dcp`'s coordinator); its outcome.
    fn assemble(
        &self,
        py: Python<'_>,
        parts: Vec<String>,
        options: Options,
    ) -> PyResult<Py<PyAny>> {
        let opts = options.commit()?;
        report(
            py,
            &self.change(py, |r| {
                let ids = parts
                    .iter()
                    .map(|p| mdl::revision::resolve(r, p))
                    .collect::<mdl::Result<Vec<_>>>()?;
                mdl::assemble::assemble(r, &ids, &opts)
            })?,
        )
    }

    /// Waits for the commit in flight and takes its outcome, or None when there was
    /// none; its failure is raised here (and not again by the next submit).
    fn finish(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        match py.detach(|| self.committer.finish()).map_err(error)? {
            Some(outcome) => Ok(Some(report(py, &outcome)?)),
            None => Ok(None),
        }
    }

    /// Waits until the commit in flight, if any, has landed or failed, without taking its
    /// outcome (`finish` and the next submit still report a failure).
    fn settle(&self, py: Python<'_>) {
        py.detach(|| self.committer.settle())
    }

    /// The commit `rev` names, as a full hex id.
    fn resolve(&self, py: Python<'_>, rev: String) -> PyResult<String> {
        self.read(py, |r| Ok(mdl::revision::resolve(r, &rev)?.to_hex()))
    }

    /// The branch HEAD names (short).
    fn head(&self, py: Python<'_>) -> PyResult<String> {
        self.read(py, |r| {
            let full = r.head_branch()?;
            Ok(full.trim_start_matches("refs/heads/").to_string())
        })
    }

    /// The tensors of commit `rev`: `[{file, name, dtype, shape, lossy}]`, in file
    /// order.
    fn tensors(&self, py: Python<'_>, rev: String) -> PyResult<Py<PyAny>> {
        let layout = self.read(py, |r| mdl::checkout::layout(r, &rev))?;
        let list: Vec<serde_json::Value> = layout
            .files
            .iter()
            .flat_map(|f| {
                f.objects().filter(|o| o.tensor).map(|o| {
                    serde_json::json!({
                        "file": f.path,
                        "name": o.name,
                        "dtype": o.header.dtype.name(),
                        "shape": o.header.shape,
                        "lossy": o.lossy,
                        "id": o.id.to_hex(),
                    })
                })
            })
            .collect();
        report(py, &list)
    }

    /// Decodes the tensors `wanted` (`(file, name)`) of commit `rev`, in the order asked:
    /// each as its dtype, shape and a new bytearray of its bytes. `held` (one a tensor, or
    /// None) is what a caller holding older versions of them has: the id of the version of
    /// `wanted[i]` it holds and those bytes (a contiguous buffer, a numpy view of its own
    /// tensor). A tensor stored as a delta over that version decodes one level against the
    /// bytes given instead of through its chain; each result is verified against its id all
    /// the same.
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (rev, wanted, held = None))]
    fn read_tensors<'py>(
        &self,
        py: Python<'py>,
        rev: String,
        wanted: Vec<(String, String)>,
        held: Option<Vec<Option<(String, Bound<'py, PyAny>)>>>,
    ) -> PyResult<Vec<(&'static str, Vec<u64>, Bound<'py, PyByteArray>)>> {
        let mut lent = Vec::new();
        if let Some(held) = held {
            if held.len() != wanted.len() {
                return Err(error("one held version (or None) a tensor"));
            }
            for (id, bytes) in held.into_iter().flatten() {
                let id: mdl::ObjectId = id.parse().map_err(error)?;
                lent.push((id, Exported::new(&bytes)?));
            }
        }
        let bases: mdl::Held<'_> = lent.iter().map(|(id, b)| (*id, b.as_ref())).collect();
        let (repo, layout, selected) = self.laid_out(py, &rev)?;
        let (started, mut bytes) = (Instant::now(), 0);
        let mut out = Vec::with_capacity(wanted.len());
        for placed in find_tensors(&layout, &rev, &wanted)? {
            bytes += placed.entry.content_len;
            let len = usize::try_from(placed.entry.content_len).map_err(error)?;
            let decoded = PyByteArray::new_with(py, len, |buf| {
                py.detach(|| match bases.is_empty() {
                    true => placed.load_into(&repo, buf),
                    false => placed.load_over(&repo, &bases, buf),
                })
                .map_err(error)
            })?;
            out.push((
                placed.header.dtype.name(),
                placed.header.shape.clone(),
                decoded,
            ));
        }
        selected.observe(Side::Decode, bytes, started.elapsed().as_secs_f64());
        Ok(out)
    }

    /// Whether each of the tensors `wanted` (`(file, name)`) of commit `rev` is stored as a
    /// masked delta over the version whose id `held[i]` is: what `patch_tensors` takes.
    fn patchable(
        &self,
        py: Python<'_>,
        rev: String,
        wanted: Vec<(String, String)>,
        held: Vec<String>,
    ) -> PyResult<Vec<bool>> {
        let (repo, layout, _) = self.laid_out(py, &rev)?;
        let placed = find_tensors(&layout, &rev, &wanted)?;
        crate::patch::patchable(py, &repo, &placed, &held)
    }

    /// Brings the caller's CPU tensors to the tensors `wanted` (`(file, name)`) of commit
    /// `rev` in place, each stored as a masked delta over the version the caller holds:
    /// `held[i]` is the id of the version tensor `i` holds and its bytes (a writable numpy view
    /// of the tensor itself). Only the changed elements are written, each tensor checked
    /// against its id as it is. All or none: False where one is not such a delta (nothing
    /// written), an error where one fails (every tensor as it was).
    fn patch_tensors<'py>(
        &self,
        py: Python<'py>,
        rev: String,
        wanted: Vec<(String, String)>,
        held: Vec<(String, Bound<'py, PyAny>)>,
    ) -> PyResult<bool> {
        let (repo, layout, _) = self.laid_out(py, &rev)?;
        let placed = find_tensors(&layout, &rev, &wanted)?;
        crate::patch::patch_in_place(py, &repo, &placed, held)
    }

    /// Decodes the tensors `wanted` (`(file, name)`) of commit `rev` onto a GPU, tensor-parallel:
    /// each into the memory of a CUDA tensor of its size at `to_gpu[i]` (`(device index,
    /// address)`). A GPU engine on that device decodes in place (or copies what it decoded on
    /// the host); for the others the result holds their bytes (a bytearray), which the caller
    /// copies, else None.
    fn read_tensors_to_gpu<'py>(
        &self,
        py: Python<'py>,
        rev: String,
        wanted: Vec<(String, String)>,
        to_gpu: Vec<(usize, u64)>,
    ) -> PyResult<Vec<Option<Bound<'py, PyByteArray>>>> {
        if to_gpu.len() != wanted.len() {
            return Err(error("one device address a tensor"));
        }
        let (repo, layout, selected) = self.laid_out(py, &rev)?;
        let tensors: Vec<_> = find_tensors(&layout, &rev, &wanted)?
            .into_iter()
            .zip(to_gpu)
            .map(|(p, (ordinal, address))| (p, DeviceCopy { ordinal, address }))
            .collect();
        let started = Instant::now();
        let loaded = py
            .detach(|| mdl::checkout::load_all_mirrored(&repo, &tensors))
            .map_err(error)?;
        let bytes = tensors.iter().map(|(p, _)| p.entry.content_len).sum();
        selected.observe(Side::Decode, bytes, started.elapsed().as_secs_f64());
        Ok(loaded
            .into_iter()
            .map(|b| b.map(|b| PyByteArray::new(py, &b)))
            .collect())
    }

    /// The whole file `path` of commit `rev`, as a bytearray.
    fn read_file<'py>(
        &self,
        py: Python<'py>,
        rev: String,
        path: String,
    ) -> PyResult<Bound<'py, PyByteArray>> {
        let (repo, layout, _) = self.laid_out(py, &rev)?;
        let file = layout
            .file(&path)
            .ok_or_else(|| error(format!("no file {path:?} in commit {rev}")))?;
        let len = usize::try_from(file.len).map_err(error)?;
        PyByteArray::new_with(py, len, |buf| {
            py.detach(|| file.load_into(&repo, buf)).map_err(error)
        })
    }
}

#[pymethods]
impl Pending {
    /// Waits for the commit; its outcome (an MdlError when it failed).
    fn wait(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        report(py, &py.detach(|| self.0.wait()).map_err(error)?)
    }

    /// Whether the commit has finished (stored or failed).
    fn done(&self) -> bool {
        self.0.done()
    }
}

fn secs(wait: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(wait).map_err(|_| {
        pyo3::exceptions::PyValueError::new_err(format!(
            "wait must be a number of seconds >= 0, not {wait}"
        ))
    })
}

/// The tensors `wanted` (`(file, name)`) of `layout`, commit `rev`, in the order asked.
fn find_tensors<'a>(
    layout: &'a Layout,
    rev: &str,
    wanted: &[(String, String)],
) -> PyResult<Vec<&'a Placed>> {
    wanted
        .iter()
        .map(|(file, name)| {
            layout
                .file(file)
                .and_then(|f| f.tensor(name))
                .ok_or_else(|| error(format!("no tensor {name:?} in {file} of commit {rev}")))
        })
        .collect()
}
