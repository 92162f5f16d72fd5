//! What can go wrong in a transfer: talking to the server, or in the local repository.

use mdl_protocol::ErrorCode;

/// What can go wrong talking to a server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Talking to the server failed, or it answered with an error.
    #[error(transparent)]
    Client(#[from] mdl_client::Error),
    /// A push or pull that would lose commits.
    #[error("{0}")]
    Rejected(String),
    /// A remote name that is not configured, or already is.
    #[error("{0}")]
    Remote(String),
    /// The other repository, which this process opened itself (one in object storage),
    /// failed; `code` is the one a server would answer the same failure with.
    #[error("{message}")]
    Peer {
        /// The code, when the failure has one.
        code: Option<ErrorCode>,
        /// What failed.
        message: String,
    },
    /// The local repository failed.
    #[error(transparent)]
    Local(#[from] mdl::Error),
}

impl Error {
    /// Its stable code: the server's, or the one this failure has on this side.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Client(e) => e.code(),
            Error::Peer { code, .. } => code.unwrap_or(ErrorCode::Internal),
            Error::Rejected(_) => ErrorCode::NotFastForward,
            Error::Remote(_) => ErrorCode::BadInput,
            Error::Local(e) => e.code(),
        }
    }
}

impl From<mdl::StoreError> for Error {
    fn from(e: mdl::StoreError) -> Self {
        Error::Local(e.into())
    }
}

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
