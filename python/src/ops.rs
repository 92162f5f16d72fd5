//! Every repository operation, whatever the backend (`mdl_ops::Operations`): a folder here, a
//! served repository over HTTP, a repository in object storage. The Python `Repository` calls
//! these for history, refs, checkouts and upkeep; commits of live state and tensor reads,
//! which need the repository on this machine, go through `local::Repo`.

use std::path::PathBuf;
use std::time::Duration;

use mdl_ops::{Access, Branches, History, Location, Operations};
use mdl_protocol::body::{GcAnswer, GcRequest};
use pyo3::prelude::*;

use crate::errors::released;
use crate::staging::Exported;
use crate::{error, report};

/// A repository at a folder, `http(s)://HOST:PORT/REPO` or `s3://BUCKET/PREFIX`.
#[pyclass(frozen, module = "mdl._mdl")]
pub struct Ops {
    ops: Box<dyn Operations>,
    /// Where and how it was reached: a fetch lending tensors reaches it again with them.
    location: Location,
    access: Access,
}

// The closures handed to `released` return the interface's error as it is; `released` boxes it
// before it crosses the GIL's release.
#[allow(clippy::result_large_err)]
#[pymethods]
impl Ops {
    /// Reaches the repository at `location` (a folder that `mdl serve` serves is opened here:
    /// the server holds its lock only while it changes it).
    #[new]
    #[pyo3(signature = (location, token = None, wait = 60.0))]
    fn new(location: PathBuf, token: Option<String>, wait: f64) -> PyResult<Ops> {
        let access = Access {
            token,
            wait: Duration::try_from_secs_f64(wait).map_err(|_| error("wait must be >= 0"))?,
            purpose: format!("python (pid {})", std::process::id()),
            follow_server: false,
            verbose: false,
            lent: mdl::Lent::default(),
        };
        // A folder is kept absolute: each call finds the repository from it, wherever the
        // program has moved to since.
        let location = match Location::parse(&location).map_err(error)? {
            Location::Folder(dir) => Location::Folder(std::path::absolute(dir).map_err(error)?),
            at => at,
        };
        Ok(Ops {
            ops: mdl_ops::open(&location, &access).map_err(error)?,
            location,
            access,
        })
    }

    /// Makes a repository at `location` (`mdl init`): a folder, one in object storage, or one
    /// on a server of a folder of repositories, for a token of `admin` scope.
    #[staticmethod]
    #[pyo3(signature = (location, token = None))]
    fn create(py: Python<'_>, location: PathBuf, token: Option<String>) -> PyResult<()> {
        let location = Location::parse(&location).map_err(error)?;
        let access = Access {
            token,
            ..Access::default()
        };
        released(py, || mdl_ops::init(&location, &access))?;
        Ok(())
    }

    /// `local`, `served` or `bucket`.
    #[getter]
    fn backend(&self) -> &'static str {
        match self.ops.backend() {
            mdl_ops::Backend::Local => "local",
            mdl_ops::Backend::Served => "served",
            mdl_ops::Backend::Bucket => "bucket",
        }
    }

    /// The folder or URL.
    #[getter]
    fn location(&self) -> String {
        self.ops.location()
    }

    /// Commits `paths` (blocking); its outcome.
    fn commit(
        &self,
        py: Python<'_>,
        paths: Vec<PathBuf>,
        options: crate::local::Options,
    ) -> PyResult<Py<PyAny>> {
        let opts = options.commit()?;
        let done = released(py, || {
            self.ops.commit(&paths, &opts, None, &mdl::NoProgress)
        })?;
        report(py, &done)
    }

    /// Writes `rev`'s files to `out` as `mdl checkout` does; its outcome.
    #[pyo3(signature = (rev, out, path = None, force = false))]
    fn checkout(
        &self,
        py: Python<'_>,
        rev: String,
        out: PathBuf,
        path: Option<String>,
        force: bool,
    ) -> PyResult<Py<PyAny>> {
        let opts = mdl::checkout::CheckoutOptions {
            force,
            path,
            ..Default::default()
        };
        let done = released(py, || {
            self.ops.checkout(&rev, &out, &opts, None, &mdl::NoProgress)
        })?;
        report(py, &done)
    }

    /// History from `rev` (HEAD when None), or with `all` of every branch and tag, newest
    /// first.
    #[pyo3(signature = (rev = None, limit = None, all = false))]
    fn log(
        &self,
        py: Python<'_>,
        rev: Option<String>,
        limit: Option<usize>,
        all: bool,
    ) -> PyResult<Py<PyAny>> {
        let entries = released(py, || match all {
            true => self.ops.log_all(limit),
            false => self.ops.log(rev.as_deref(), limit),
        })?;
        report(py, &entries)
    }

    /// A commit, its files and tensors.
    fn show(&self, py: Python<'_>, rev: String) -> PyResult<Py<PyAny>> {
        report(py, &released(py, || self.ops.show(&rev))?)
    }

    /// What changed from `a` to `b`.
    fn diff(&self, py: Python<'_>, a: String, b: String) -> PyResult<Py<PyAny>> {
        report(py, &released(py, || self.ops.diff(&a, &b))?)
    }

    /// Branches.
    fn branches(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        report(py, &released(py, || self.ops.branches(Branches::Local))?)
    }

    /// Tags.
    fn tags(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        report(py, &released(py, || self.ops.tags())?)
    }

    /// Creates branch `name` at `rev` (HEAD when None); its commit's hex id.
    #[pyo3(signature = (name, rev = None))]
    fn create_branch(&self, py: Python<'_>, name: String, rev: Option<String>) -> PyResult<String> {
        let at = released(py, || self.ops.create_branch(&name, rev.as_deref()))?;
        Ok(at.to_hex())
    }

    /// Creates tag `name` at `rev` (HEAD when None), annotated with `message` when given.
    #[pyo3(signature = (name, rev = None, message = None))]
    fn create_tag(
        &self,
        py: Python<'_>,
        name: String,
        rev: Option<String>,
        message: Option<String>,
    ) -> PyResult<String> {
        let at = released(py, || {
            self.ops
                .create_tag(&name, rev.as_deref(), message.as_deref())
        })?;
        Ok(at.to_hex())
    }

    /// Deletes branch `name` (with `force`, even if nothing else reaches its commits).
    fn delete_branch(&self, py: Python<'_>, name: String, force: bool) -> PyResult<()> {
        released(py, || self.ops.delete_branch(&name, force)).map(drop)
    }

    /// Deletes tag `name`.
    fn delete_tag(&self, py: Python<'_>, name: String) -> PyResult<()> {
        released(py, || self.ops.delete_tag(&name)).map(drop)
    }

    /// Points HEAD at branch `name`.
    fn switch(&self, py: Python<'_>, name: String) -> PyResult<()> {
        released(py, || self.ops.switch(&name))
    }

    /// Moves the current branch to `rev`; the move.
    fn reset(&self, py: Python<'_>, rev: String) -> PyResult<Py<PyAny>> {
        report(py, &released(py, || self.ops.reset(&rev))?)
    }

    /// Merges `revs` tensor by tensor into a commit on `branch` (the current one when None):
    /// what `mdl merge --json` prints.
    #[pyo3(signature = (revs, strategy, weights, base, density, optimizer, message, branch, author))]
    #[allow(clippy::too_many_arguments)]
    fn merge(
        &self,
        py: Python<'_>,
        revs: Vec<String>,
        strategy: String,
        weights: Option<Vec<f64>>,
        base: Option<String>,
        density: f64,
        optimizer: bool,
        message: String,
        branch: Option<String>,
        author: Option<String>,
    ) -> PyResult<Py<PyAny>> {
        let opts = mdl::merge::MergeOptions {
            strategy: mdl::merge::Strategy::parse(&strategy, density)
                .map_err(|why| error(mdl::Error::Merge(why)))?,
            weights,
            base,
            optimizer,
        };
        let commit = mdl::commit::CommitOptions {
            message,
            branch: branch
                .as_deref()
                .map(mdl::RefName::new)
                .transpose()
                .map_err(error)?,
            author,
            ..Default::default()
        };
        let outcome = released(py, || {
            self.ops.merge(&revs, &opts, &commit, &mdl::NoProgress)
        })?;
        report(py, &outcome)
    }

    /// A ref's history (HEAD's branch when None): `{ref, entries}`.
    #[pyo3(signature = (name = None))]
    fn reflog(&self, py: Python<'_>, name: Option<String>) -> PyResult<Py<PyAny>> {
        let (full, entries) = released(py, || self.ops.reflog(name.as_deref()))?;
        report(py, &serde_json::json!({ "ref": full, "entries": entries }))
    }

    /// Every setting: `[[key, value, is_default]]`.
    fn config(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        report(py, &released(py, || self.ops.config())?)
    }

    /// Changes one setting.
    fn set_config(&self, py: Python<'_>, key: String, value: String) -> PyResult<()> {
        released(py, || self.ops.set_config(&key, &value)).map(drop)
    }

    /// Removes what nothing reaches (`mdl gc`); the report.
    #[pyo3(signature = (prune_older_than = None, dry_run = false))]
    fn gc(
        &self,
        py: Python<'_>,
        prune_older_than: Option<String>,
        dry_run: bool,
    ) -> PyResult<Py<PyAny>> {
        let request = GcRequest {
            prune_older_than,
            expire_reflog: None,
            dry_run,
        };
        match released(py, || self.ops.gc(&request, &mdl::NoProgress))? {
            GcAnswer::Disk(outcome) => report(py, &outcome),
            GcAnswer::Bucket(outcome) => report(py, &outcome),
        }
    }

    /// Checks everything (`mdl fsck`); the report.
    fn fsck(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        report(py, &released(py, || self.ops.fsck(&mdl::NoProgress))?)
    }

    /// Repository totals; with `lossy`, HEAD's series under the lossy papers' accountings.
    #[pyo3(signature = (lossy=false))]
    fn stats(&self, py: Python<'_>, lossy: bool) -> PyResult<Py<PyAny>> {
        report(py, &released(py, || self.ops.stats(lossy))?)
    }

    /// `mdl fetch REMOTE [BRANCH] [--depth N]`: what it moved, as `mdl fetch --json` prints it.
    ///
    /// `held`: tensors the caller holds (`(id, bytes)`, the bytes a contiguous buffer such as a
    /// numpy view of a model's own tensor), lent to the fetch: a delta that comes over one of
    /// them is verified against those bytes instead of decoding its base's chain here.
    #[pyo3(signature = (remote, branch = None, depth = None, held = None))]
    fn fetch(
        &self,
        py: Python<'_>,
        remote: String,
        branch: Option<String>,
        depth: Option<u32>,
        held: Option<Vec<(String, Bound<'_, PyAny>)>>,
    ) -> PyResult<Py<PyAny>> {
        let history = depth.map_or(History::All, History::Newest);
        let lending = match held {
            Some(held) if !held.is_empty() => {
                let mut lent = std::collections::HashMap::new();
                for (id, bytes) in held {
                    let id: mdl::ObjectId = id.parse().map_err(error)?;
                    let bytes: mdl::LentBytes = std::sync::Arc::new(Exported::new(&bytes)?);
                    lent.insert(id, bytes);
                }
                let access = Access {
                    lent: mdl::Lent(std::sync::Arc::new(lent)),
                    ..self.access.clone()
                };
                Some(mdl_ops::open(&self.location, &access).map_err(error)?)
            }
            _ => None,
        };
        let ops = lending.as_ref().unwrap_or(&self.ops);
        let done = released(py, || {
            ops.fetch(&remote, branch.as_deref(), false, history, &mdl::NoProgress)
        })?;
        report(py, &done.outcome)
    }

    /// Waits until `branch` of remote `remote` no longer points at `held` (what this side
    /// last saw of it), at most `timeout` seconds: its new commit, or None.
    fn wait_remote_branch(
        &self,
        py: Python<'_>,
        remote: String,
        branch: String,
        held: Option<String>,
        timeout: f64,
    ) -> PyResult<Option<String>> {
        let held = held
            .map(|f| f.parse::<mdl::ObjectId>())
            .transpose()
            .map_err(error)?;
        let timeout =
            Duration::try_from_secs_f64(timeout).map_err(|_| error("timeout must be >= 0"))?;
        let moved = released(py, || {
            self.ops.wait_remote_branch(&remote, &branch, held, timeout)
        })?;
        Ok(moved.map(|id| id.to_hex()))
    }
}
