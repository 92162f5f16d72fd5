//! A repository on an `mdl serve` server: history, refs, file commits and downloads.

use std::path::PathBuf;

use pyo3::prelude::*;

use crate::{error, json};

/// A repository at `http://HOST:PORT/REPO`, with a bearer token when given.
#[pyclass(frozen, module = "mdl._mdl")]
pub struct Remote(mdl_remote::Remote);

#[pymethods]
impl Remote {
    #[new]
    #[pyo3(signature = (url, token = None))]
    fn new(url: &str, token: Option<String>) -> PyResult<Remote> {
        mdl_remote::Remote::new(url, token)
            .map(Remote)
            .map_err(error)
    }

    /// The repository's URL.
    #[getter]
    fn url(&self) -> String {
        self.0.url().to_string()
    }

    /// History from `rev` (HEAD when None), newest first, as JSON.
    #[pyo3(signature = (rev = None, limit = None))]
    fn log(&self, py: Python<'_>, rev: Option<String>, limit: Option<usize>) -> PyResult<String> {
        json(
            &py.detach(|| self.0.log(rev.as_deref(), limit))
                .map_err(error)?,
        )
    }

    /// A commit, its files and tensors, as JSON.
    fn show(&self, py: Python<'_>, rev: String) -> PyResult<String> {
        json(&py.detach(|| self.0.show(&rev)).map_err(error)?)
    }

    /// Branches, tags and HEAD, as JSON.
    fn refs(&self, py: Python<'_>) -> PyResult<String> {
        json(&py.detach(|| self.0.refs()).map_err(error)?)
    }

    /// Uploads `paths` as a commit (blocking): one file as it is, a folder or several paths as
    /// one tree, as `mdl commit` sends them; the outcome as JSON.
    fn commit_paths(
        &self,
        py: Python<'_>,
        paths: Vec<PathBuf>,
        options: crate::local::Options,
    ) -> PyResult<String> {
        let opts = options.commit()?;
        json(
            &py.detach(|| self.0.commit_paths(&paths, &opts))
                .map_err(error)?,
        )
    }

    /// Downloads `rev`'s files to `out` as `mdl checkout` writes them; the outcome as JSON.
    #[pyo3(signature = (rev, out, path = None, force = false))]
    fn checkout(
        &self,
        py: Python<'_>,
        rev: String,
        out: PathBuf,
        path: Option<String>,
        force: bool,
    ) -> PyResult<String> {
        json(
            &py.detach(|| self.0.download(&rev, &out, path.as_deref(), force))
                .map_err(error)?,
        )
    }
}
