//! What can go wrong with a repository in object storage.

/// What can go wrong with a repository in object storage.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A location that is not `s3://BUCKET[/PREFIX]`, or settings the client refuses.
    #[error("{0}")]
    Location(String),
    /// The object store failed (after its retries) or answered what no mdl writer writes.
    #[error("{url}: {why}")]
    Storage {
        /// The repository's location.
        url: String,
        /// What failed.
        why: String,
    },
    /// Nothing at the location says it is a repository.
    #[error("{0} is not an mdl repository (mdl init {0} makes one)")]
    NotARepository(String),
    /// `init` where a repository already is.
    #[error("{0} is already an mdl repository")]
    AlreadyExists(String),
    /// Another writer changed a ref first; nothing of this command was published.
    #[error("{0}")]
    Conflict(String),
    /// A command this build does not run on object storage.
    #[error("{0}")]
    Unsupported(String),
    /// The local replica failed.
    #[error(transparent)]
    Local(#[from] mdl::Error),
    /// The local cache (outside the replica's `.mdl`) could not be read or written.
    #[error("{}: {source}", path.display())]
    Cache {
        /// The file or folder.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl Error {
    /// Its stable code (`docs/HTTP_API.md`), as a server over the bucket answers it.
    pub fn code(&self) -> mdl_protocol::ErrorCode {
        use mdl_protocol::ErrorCode as C;
        match self {
            Error::Local(e) => e.code(),
            Error::Cache { .. } => C::IoError,
            Error::Location(_) | Error::Storage { .. } => C::StorageError,
            Error::NotARepository(_) => C::NoSuchRepository,
            Error::AlreadyExists(_) => C::Exists,
            Error::Conflict(_) => C::RefConflict,
            Error::Unsupported(_) => C::Unsupported,
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
