//! The stable error codes of library errors (`docs/HTTP_API.md`): what the server answers, what
//! `mdl --json` prints and what Python's exception classes are chosen by. The codes themselves
//! are the protocol's ([`ErrorCode`]); which error has which is the library's to say.

use mdl_protocol::ErrorCode;

use crate::{Error, StoreError};

impl Error {
    /// This error's stable code: what the server answers and `mdl --json` prints for it.
    pub fn code(&self) -> ErrorCode {
        use Error as E;
        use ErrorCode as C;
        match self {
            E::Store(s) => store_code(s),
            E::Input { .. } | E::Assemble(_) | E::Merge(_) => C::BadInput,
            E::InvalidInput { .. } => C::InvalidSafetensors,
            E::Changed { .. } => C::InputChanged,
            E::DamagedCheckpoint { .. } => C::BadInput,
            E::TooLarge(_) => C::TooLarge,
            E::UnknownRevision(_)
            | E::NotABranchHere { .. }
            | E::ShortIdPrefix(_)
            | E::NoSuchAncestor { .. } => C::UnknownRevision,
            E::NoSuchPath { .. } => C::NotFound,
            E::AmbiguousRevision { .. } => C::AmbiguousRevision,
            E::UnbornBranch(_) => C::UnbornBranch,
            E::InvalidName(_) => C::InvalidName,
            E::RefExists { .. } => C::RefExists,
            E::NoSuchRef { .. } => C::NoSuchRef,
            E::DeleteCurrentBranch(_) => C::CurrentBranch,
            E::UnmergedBranch { .. } => C::UnmergedBranch,
            E::OutputExists(_) | E::Output { .. } | E::OutputInRepository(_) => C::IoError,
            E::InvalidMetric(_) => C::InvalidMetric,
            E::InvalidConfig { .. } => C::InvalidConfig,
            E::UnknownConfig(_) => C::UnknownConfig,
            E::EvalCommand { .. } => C::EvalFailed,
            E::Corrupt { .. } | E::WrongKind { .. } => C::CorruptObject,
            E::Encode { .. } => C::Internal,
            // The background commit's own error, where the library made it.
            E::Background(inner) => inner
                .downcast_ref::<Error>()
                .map_or(C::Internal, Error::code),
            E::BadTransfer(_)
            | E::TransferCut { .. }
            | E::BaseNotSent { .. }
            | E::PlanChanged { .. } => C::BadTransfer,
            E::Incomplete(_) => C::Incomplete,
            E::NotFastForward { .. } => C::NotFastForward,
            E::Expired { .. } => C::Expired,
            E::InvalidDuration(_) => C::InvalidDuration,
            E::GpuUnavailable(_) => C::GpuUnavailable,
        }
    }
}

/// The stable code of a store error.
pub fn store_code(e: &StoreError) -> ErrorCode {
    use ErrorCode as C;
    use StoreError as E;
    match e {
        E::Io { .. } | E::Output(_) => C::IoError,
        E::Db(_) | E::DbIo(_) | E::Malformed(_) | E::ReadOnlyDatabase => C::DatabaseError,
        E::Damaged(_) => C::DatabaseDamaged,
        E::NeedsRecovery => C::NeedsRecovery,
        E::Corrupt { .. } => C::CorruptObject,
        E::Missing(_) => C::MissingObject,
        E::Fetch { .. } => C::StorageError,
        E::Busy { .. } => C::Busy,
        E::OutOfMemory(_) => C::OutOfMemory,
        E::TooLarge { .. } => C::TooLarge,
        E::ReadOnly(_) => C::ReadOnly,
        E::NotARepository(_) => C::NoSuchRepository,
        E::AlreadyExists(_) => C::Exists,
        E::NewerFormat { .. } => C::NewerFormat,
        E::InputChanged(_) => C::InputChanged,
        E::RefConflict { .. } => C::RefConflict,
    }
}
