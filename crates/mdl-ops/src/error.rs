//! The interface's error: a backend's own, or a refusal of an operation it cannot do.

use mdl_protocol::ErrorCode;

use crate::{Backend, Operation};

/// What an operation failed with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The backend cannot do this operation; `instead` says what to do.
    #[error("mdl {operation} does not run on {backend}: {instead}")]
    Unsupported {
        /// What was asked.
        operation: Operation,
        /// Where.
        backend: Backend,
        /// What to do instead.
        instead: String,
    },
    /// A location that names no place mdl keeps repositories.
    #[error("{0}")]
    Location(String),
    /// The repository (here, or the replica of one in object storage) failed.
    #[error(transparent)]
    Local(#[from] mdl::Error),
    /// The server, or a transfer to or from another repository, failed.
    #[error(transparent)]
    Remote(#[from] mdl_remote::Error),
    /// The object storage, or the replica's upkeep, failed.
    #[error(transparent)]
    Bucket(#[from] mdl_bucket::Error),
}

/// What the interface's operations return.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Its stable code, as the CLI's `--json`, the HTTP API and Python's exceptions name it.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Unsupported { .. } => ErrorCode::Unsupported,
            Error::Location(_) => ErrorCode::BadInput,
            Error::Local(e) => library_code(e),
            Error::Remote(e) => e.code(),
            Error::Bucket(e) => e.code(),
        }
    }
}

/// The stable code of a failure made by any of mdl's layers (this interface, the library, the
/// store, object storage, a server or a transfer), looking inside a background commit's
/// failure for the error it kept; `None` for an error none of them made.
pub fn code_of(e: &(dyn std::error::Error + 'static)) -> Option<ErrorCode> {
    if let Some(e) = e.downcast_ref::<Error>() {
        return Some(e.code());
    }
    if let Some(e) = e.downcast_ref::<mdl::Error>() {
        return Some(library_code(e));
    }
    if let Some(e) = e.downcast_ref::<mdl::StoreError>() {
        return Some(mdl::store_code(e));
    }
    if let Some(e) = e.downcast_ref::<mdl_bucket::Error>() {
        return Some(e.code());
    }
    if let Some(e) = e.downcast_ref::<mdl_client::Error>() {
        return Some(e.code());
    }
    e.downcast_ref::<mdl_remote::Error>()
        .map(mdl_remote::Error::code)
}

/// A library error's code; a background commit's, that of the error it kept.
fn library_code(e: &mdl::Error) -> ErrorCode {
    match e {
        mdl::Error::Background(inner) => code_of(&**inner).unwrap_or(ErrorCode::Internal),
        e => e.code(),
    }
}

impl From<mdl_client::Error> for Error {
    fn from(e: mdl_client::Error) -> Error {
        Error::Remote(e.into())
    }
}

impl From<mdl::StoreError> for Error {
    fn from(e: mdl::StoreError) -> Error {
        Error::Local(e.into())
    }
}

/// The refusal of `operation` on `backend`.
pub(crate) fn unsupported(
    operation: Operation,
    backend: Backend,
    instead: impl Into<String>,
) -> Error {
    Error::Unsupported {
        operation,
        backend,
        instead: instead.into(),
    }
}
