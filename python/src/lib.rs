//! `mdl._mdl`: the library in-process for the Python package (python/mdl). The Python side
//! owns the user-facing API (state dicts, dtypes, dataclasses); this module gives it
//! repositories, background commits of staged buffers, decoded tensors and the library's
//! reports as JSON. Every call that touches the repository runs with the interpreter released.

use pyo3::prelude::*;

mod local;
mod remote;
mod staging;

pyo3::create_exception!(
    _mdl,
    MdlError,
    pyo3::exceptions::PyException,
    "An mdl operation failed; the message says why (the repository is as it was)."
);

/// A library error as a Python exception.
pub(crate) fn error(e: impl std::fmt::Display) -> PyErr {
    MdlError::new_err(e.to_string())
}

/// A library report as JSON (the Python side builds its objects from it).
pub(crate) fn json(v: &impl serde::Serialize) -> PyResult<String> {
    serde_json::to_string(v).map_err(error)
}

#[pymodule]
fn _mdl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MdlError", m.py().get_type::<MdlError>())?;
    m.add_class::<local::Repo>()?;
    m.add_class::<local::Pending>()?;
    m.add_class::<remote::Remote>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
