use std::path::PathBuf;

use mdl_format::{FormatError, ObjectId};

/// Errors from the repository store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file system operation failed.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// To which path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Reading or writing the metadata database's file failed (a full disk, an I/O error); the
    /// database must be opened again before it is used.
    #[error("metadata database: {0}")]
    DbIo(std::io::Error),
    /// The metadata database refused an operation for a reason of its own (neither damage nor
    /// I/O).
    #[error("metadata database: {0}")]
    Db(DbError),
    /// A value stored in the metadata database does not decode.
    #[error("metadata database: malformed {0}")]
    Malformed(&'static str),
    /// A change was asked of a database opened for reading.
    #[error("metadata database opened read-only")]
    ReadOnlyDatabase,
    /// `meta.redb` is missing, or damaged in a way redb detects (a checksum, a structure that
    /// does not hold together) or trips over.
    #[error("meta.redb is damaged or missing ({0}); `mdl fsck --repair` rebuilds it from the object records and the journal")]
    Damaged(String),
    /// The metadata database must be recovered by a writer first.
    #[error("metadata database needs recovery after an interrupted write")]
    NeedsRecovery,
    /// An object's record could not be decoded or failed verification.
    #[error("{kind} object {id} is corrupt: {source}")]
    Corrupt {
        /// The object.
        id: ObjectId,
        /// The object's kind, as far as known.
        kind: &'static str,
        /// What is wrong.
        source: FormatError,
    },
    /// An object the index or a reference names is not present.
    #[error("object {0} is missing from the store")]
    Missing(ObjectId),
    /// A record this store lacks could not be fetched from where its records are kept
    /// ([`crate::source`]).
    #[error("cannot fetch the record of {id}: {why}")]
    Fetch {
        /// The (first) record asked for.
        id: ObjectId,
        /// Why, in a sentence.
        why: String,
    },
    /// Another process holds the repository.
    #[error(
        "repository is in use by {holder}; gave up after waiting {waited_secs} s (see --wait)"
    )]
    Busy {
        /// Who holds it, as the holder recorded.
        holder: String,
        /// How long this process waited.
        waited_secs: u64,
    },
    /// The repository is read-only and a write was requested.
    #[error("repository {} is read-only", .0.display())]
    ReadOnly(PathBuf),
    /// Not an mdl repository.
    #[error("{} is not an mdl repository (no .mdl/meta.redb; run `mdl init`)", .0.display())]
    NotARepository(PathBuf),
    /// `init` found an existing repository.
    #[error("{} already exists", .0.display())]
    AlreadyExists(PathBuf),
    /// The repository was written by a newer mdl.
    #[error("repository format version {found} is newer than this mdl reads ({supported})")]
    NewerFormat {
        /// Version in the repository.
        found: u64,
        /// Newest version this build reads.
        supported: u64,
    },
    /// Writing decoded bytes to the caller's output failed.
    #[error("cannot write output: {0}")]
    Output(std::io::Error),
    /// The input's bytes changed while they were being stored.
    #[error("input changed while it was being committed (tensor {0} no longer matches its hash); nothing was stored")]
    InputChanged(ObjectId),
    /// A manifest or commit larger than any record of its kind may be.
    #[error("the {what} is {len} bytes, over the limit of {limit} bytes for one record")]
    TooLarge {
        /// The object's kind.
        what: &'static str,
        /// Its length.
        len: u64,
        /// The limit.
        limit: u64,
    },
    /// Memory for decoding an object could not be had.
    #[error("cannot allocate {0} bytes to decode an object")]
    OutOfMemory(u64),
    /// A compare-and-swap on a ref found another value.
    #[error("ref {name} changed concurrently (expected {expected}, found {found})")]
    RefConflict {
        /// The ref.
        name: String,
        /// What the caller expected.
        expected: String,
        /// What was there.
        found: String,
    },
}

impl StoreError {
    pub(crate) fn io(
        op: &'static str,
        path: &std::path::Path,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| StoreError::Io { op, path, source }
    }

    /// Like [`StoreError::io`] for object `id`'s record file: a file that is not there is the
    /// object missing.
    pub(crate) fn record_io(
        id: &ObjectId,
        op: &'static str,
        path: &std::path::Path,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let (id, io) = (*id, StoreError::io(op, path));
        move |source| match source.kind() {
            std::io::ErrorKind::NotFound => StoreError::Missing(id),
            _ => io(source),
        }
    }

    /// Whether this is this machine failing to write (a full disk or quota, a file size
    /// limit, a read-only file system, or any failed create, write, sync or rename) rather
    /// than anything wrong with what is stored: a check that meets it cannot go on, and must
    /// not call what it was checking damaged.
    pub fn is_local_write_failure(&self) -> bool {
        match self {
            StoreError::Io { op, source, .. } => {
                matches!(*op, "create" | "write" | "sync" | "rename")
                    || matches!(
                        source.raw_os_error(),
                        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG | libc::EROFS)
                    )
            }
            StoreError::DbIo(_) | StoreError::Output(_) => true,
            _ => false,
        }
    }

    /// Whether the underlying cause is a full disk.
    pub fn is_disk_full(&self) -> bool {
        match self {
            StoreError::Io { source, .. }
            | StoreError::Output(source)
            | StoreError::DbIo(source) => source.raw_os_error() == Some(libc::ENOSPC),
            _ => false,
        }
    }
}

/// A redb error as a store error: corruption is [`StoreError::Damaged`], I/O is
/// [`StoreError::DbIo`]. mdl opens every table with one fixed definition, so a table whose
/// stored definition differs (a flipped bit in its type name) is damage too.
pub(crate) fn db<E: Into<redb::Error>>(e: E) -> StoreError {
    match e.into() {
        redb::Error::Corrupted(why) => StoreError::Damaged(why),
        e @ (redb::Error::TableTypeMismatch { .. }
        | redb::Error::TableIsMultimap(_)
        | redb::Error::TableIsNotMultimap(_)
        | redb::Error::TypeDefinitionChanged { .. }) => StoreError::Damaged(e.to_string()),
        redb::Error::Io(e) => StoreError::DbIo(e),
        redb::Error::PreviousIo => StoreError::DbIo(std::io::Error::other(
            "an earlier write to the database failed",
        )),
        other => StoreError::Db(DbError(Box::new(other))),
    }
}

/// An error of the database library, kept opaque so that no other crate depends on it.
#[derive(Debug)]
pub struct DbError(Box<redb::Error>);

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for DbError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}
