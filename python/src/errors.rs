//! Errors a program can catch: `MdlError` and a subclass for each kind of failure, chosen by
//! the stable error code the CLI's `--json` and the HTTP API report (`docs/HTTP_API.md`), which
//! every raised error carries as `.code`.

use std::any::Any;
use std::error::Error as StdError;

use mdl_protocol::ErrorCode;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

pyo3::create_exception!(
    _mdl,
    MdlError,
    PyException,
    "An mdl operation failed; the message says why (the repository is as it was). `.code` is \
     the stable error code (docs/HTTP_API.md)."
);
pyo3::create_exception!(
    _mdl,
    InvalidInput,
    MdlError,
    "Refused input: a malformed checkpoint, an argument or setting out of range, an ambiguous \
     revision."
);
pyo3::create_exception!(
    _mdl,
    PermissionDenied,
    MdlError,
    "No token, a token without the scope, or a read-only repository."
);
pyo3::create_exception!(
    _mdl,
    NotFound,
    MdlError,
    "No such repository, revision, branch, tag, file or tensor."
);
pyo3::create_exception!(
    _mdl,
    Conflict,
    MdlError,
    "A concurrent change or an existing name: a ref moved, a branch would lose commits, a name \
     is taken, the input changed while it was committed."
);
pyo3::create_exception!(
    _mdl,
    Expired,
    MdlError,
    "A checkpoint of a thinned commit: retention deleted some of its tensors."
);
pyo3::create_exception!(
    _mdl,
    Corrupt,
    MdlError,
    "A stored object or the database failed verification (`mdl fsck`; `--repair` rebuilds the \
     database)."
);
pyo3::create_exception!(
    _mdl,
    Busy,
    MdlError,
    "Another process holds the repository, or it needs recovery, or a server is out of room: \
     try again."
);
pyo3::create_exception!(
    _mdl,
    Unavailable,
    MdlError,
    "A server, the object storage or a GPU could not be reached or used."
);
pyo3::create_exception!(
    _mdl,
    Unsupported,
    MdlError,
    "Not done for this kind of repository (one in object storage, or over HTTP)."
);

/// Adds the classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let base = py.get_type::<MdlError>();
    base.setattr("code", py.None())?;
    m.add("MdlError", base)?;
    m.add("InvalidInput", py.get_type::<InvalidInput>())?;
    m.add("PermissionDenied", py.get_type::<PermissionDenied>())?;
    m.add("NotFound", py.get_type::<NotFound>())?;
    m.add("Conflict", py.get_type::<Conflict>())?;
    m.add("Expired", py.get_type::<Expired>())?;
    m.add("Corrupt", py.get_type::<Corrupt>())?;
    m.add("Busy", py.get_type::<Busy>())?;
    m.add("Unavailable", py.get_type::<Unavailable>())?;
    m.add("Unsupported", py.get_type::<Unsupported>())?;
    Ok(())
}

/// An error as the Python exception of its kind, with its code as `.code`.
pub(crate) fn error<E: std::fmt::Display + 'static>(e: E) -> PyErr {
    let code = code_of(&e);
    let message = e.to_string();
    let err = match code.status() {
        401 | 403 => PermissionDenied::new_err(message),
        404 => NotFound::new_err(message),
        409 => Conflict::new_err(message),
        410 => Expired::new_err(message),
        501 => Unsupported::new_err(message),
        _ => match code {
            ErrorCode::CorruptObject | ErrorCode::MissingObject | ErrorCode::DatabaseDamaged => {
                Corrupt::new_err(message)
            }
            ErrorCode::Busy | ErrorCode::NeedsRecovery | ErrorCode::OutOfMemory => {
                Busy::new_err(message)
            }
            ErrorCode::GpuUnavailable
            | ErrorCode::StorageError
            | ErrorCode::Unreachable
            | ErrorCode::RequestTimeout => Unavailable::new_err(message),
            c if c.status() < 500 => InvalidInput::new_err(message),
            _ => MdlError::new_err(message),
        },
    };
    Python::attach(|py| {
        // An attribute of the instance; failing to set it leaves the class's None.
        let _ = err.value(py).setattr("code", code.as_str());
    });
    err
}

/// The stable code of `e` (`mdl_ops::code_of`, for an error of mdl's layers); a message this
/// module wrote about its arguments is `bad_input`, anything else `internal`.
fn code_of(e: &dyn Any) -> ErrorCode {
    if let Some(code) = layered(e).and_then(mdl_ops::code_of) {
        return code;
    }
    if e.is::<String>() || e.is::<&str>() {
        return ErrorCode::BadInput;
    }
    ErrorCode::Internal
}

/// `e` as an error, when it is one of mdl's layers' (what this module is given to raise).
fn layered(e: &dyn Any) -> Option<&(dyn StdError + 'static)> {
    if let Some(e) = e.downcast_ref::<mdl_ops::Error>() {
        return Some(e);
    }
    if let Some(e) = e.downcast_ref::<mdl::Error>() {
        return Some(e);
    }
    if let Some(e) = e.downcast_ref::<mdl::StoreError>() {
        return Some(e);
    }
    e.downcast_ref::<mdl_bucket::Error>().map(|e| e as _)
}

/// Runs `f` with the GIL released; its failure as the Python exception of its kind. (The
/// error crosses the release boxed: it is large.)
pub(crate) fn released<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> mdl_ops::Result<T> + Send,
) -> PyResult<T> {
    py.detach(|| f().map_err(Box::new)).map_err(|e| error(*e))
}
