//! `mdl._mdl`: the library in-process for the Python package (python/mdl). The Python side
//! owns the user-facing API (state dicts, dtypes, dataclasses); this module gives it
//! repositories, background commits of staged buffers, decoded tensors and the library's
//! reports as Python objects. Every call that touches the repository runs with the interpreter
//! released.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::Value;

mod errors;
mod local;
mod ops;
mod patch;
mod staging;

pub(crate) use errors::error;

/// A library report as the Python objects it serializes to — dicts, lists, str, int, float,
/// bool and None, in the shapes `mdl --json` prints — from which the Python side builds its
/// dataclasses. Nothing is written out as text and parsed again.
pub(crate) fn report(py: Python<'_>, v: &impl serde::Serialize) -> PyResult<Py<PyAny>> {
    python(py, &serde_json::to_value(v).map_err(error)?)
}

fn python(py: Python<'_>, v: &Value) -> PyResult<Py<PyAny>> {
    Ok(match v {
        Value::Null => py.None(),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any().unbind(),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_pyobject(py)?.into_any().unbind(),
            (None, Some(u)) => u.into_pyobject(py)?.into_any().unbind(),
            _ => n.as_f64().into_pyobject(py)?.into_any().unbind(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any().unbind(),
        Value::Array(items) => {
            let items = items
                .iter()
                .map(|x| python(py, x))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any().unbind()
        }
        Value::Object(fields) => {
            let dict = PyDict::new(py);
            for (k, x) in fields {
                dict.set_item(k, python(py, x)?)?;
            }
            dict.into_any().unbind()
        }
    })
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
