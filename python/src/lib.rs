//! `mdl._mdl`: the library in-process for the Python package (python/mdl). The Python side
//! owns the user-facing API (state dicts, dtypes, dataclasses); this module gives it
//! repositories, background commits of staged buffers, decoded tensors and the library's
//! reports as JSON. Every call that touches the repository runs with the interpreter released.

use pyo3::prelude::*;

mod errors;
mod local;
mod ops;
mod staging;

pub(crate) use errors::error;

/// A library report as JSON (the Python side builds its objects from it).
pub(crate) fn json(v: &impl serde::Serialize) -> PyResult<String> {
    serde_json::to_string(v).map_err(error)
}

#[pymodule]
fn _mdl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<local::Repo>()?;
    m.add_class::<local::Pending>()?;
    m.add_class::<ops::Ops>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
