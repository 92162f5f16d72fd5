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
            Error::Local(e) => ErrorCode::of(e),
            Error::Remote(e) => e.code(),
            Error::Bucket(e) => e.code(),
        }
    }

    /// The library error inside, if the failure was one.
    pub fn library(&self) -> Option<&mdl::Error> {
        match self {
            Error::Local(e)
            | Error::Remote(mdl_remote::Error::Local(e))
            | Error::Bucket(mdl_bucket::Error::Local(e)) => Some(e),
            _ => None,
        }
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
