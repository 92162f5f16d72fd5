//! The stable error codes and the HTTP status each is sent with (`docs/HTTP_API.md`'s table).

use std::fmt;

macro_rules! codes {
    ($($(#[doc = $doc:literal])* $variant:ident = $text:literal, $status:literal;)*) => {
        /// A stable, machine-readable error code. Codes are only ever added.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[doc = $doc])* $variant,)*
        }

        impl ErrorCode {
            /// Every code, in the order of the documentation's table.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The code as it appears in a body.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $text,)*
                }
            }

            /// The HTTP status an answer with this code has.
            pub fn status(self) -> u16 {
                match self {
                    $(ErrorCode::$variant => $status,)*
                }
            }
        }

        impl std::str::FromStr for ErrorCode {
            type Err = UnknownCode;
            fn from_str(s: &str) -> Result<Self, UnknownCode> {
                match s {
                    $($text => Ok(ErrorCode::$variant),)*
                    _ => Err(UnknownCode(s.to_string())),
                }
            }
        }
    };
}

codes! {
    /// Malformed JSON body or query string.
    BadRequest = "bad_request", 400;
    /// An unknown or malformed commit parameter.
    BadParameter = "bad_parameter", 400;
    /// The body ended before its Content-Length.
    BadBody = "bad_body", 400;
    /// Not one component of `[A-Za-z0-9._-]`, or starts with `.`.
    InvalidRepositoryName = "invalid_repository_name", 400;
    /// Empty, absolute, a `..` component, or control characters.
    InvalidTensorName = "invalid_tensor_name", 400;
    /// Not 64 hex digits.
    InvalidId = "invalid_id", 400;
    /// A branch or tag name breaking the naming rules.
    InvalidName = "invalid_name", 400;
    /// An uploaded checkpoint that is not valid safetensors.
    InvalidSafetensors = "invalid_safetensors", 400;
    /// A command line `mdl` cannot parse, or a remote URL it cannot use (never sent by a
    /// server).
    Usage = "usage", 400;
    /// The upload could not be read.
    BadInput = "bad_input", 400;
    /// An id prefix matching several commits.
    AmbiguousRevision = "ambiguous_revision", 400;
    /// A malformed metric.
    InvalidMetric = "invalid_metric", 400;
    /// A configuration value out of range.
    InvalidConfig = "invalid_config", 400;
    /// A configuration key mdl does not know.
    UnknownConfig = "unknown_config", 400;
    /// The evaluation command failed.
    EvalFailed = "eval_failed", 400;
    /// A pack that is truncated or fails verification.
    BadTransfer = "bad_transfer", 400;
    /// A gc duration that is not a whole number with a unit.
    InvalidDuration = "invalid_duration", 400;
    /// No token, or not one of the server's.
    Unauthorized = "unauthorized", 401;
    /// A read token on a write route.
    Forbidden = "forbidden", 403;
    /// The repository's files are read-only.
    ReadOnly = "read_only", 403;
    /// No such route, manifest, tensor or object.
    NotFound = "not_found", 404;
    /// No repository of that name.
    NoSuchRepository = "no_such_repository", 404;
    /// The revision names nothing.
    UnknownRevision = "unknown_revision", 404;
    /// HEAD's branch has no commit yet.
    UnbornBranch = "unborn_branch", 404;
    /// No such branch or tag.
    NoSuchRef = "no_such_ref", 404;
    /// The route does not take that method.
    MethodNotAllowed = "method_not_allowed", 405;
    /// An upload that sent nothing for the body timeout.
    RequestTimeout = "request_timeout", 408;
    /// Compare-and-swap found another value (a concurrent change).
    RefConflict = "ref_conflict", 409;
    /// A branch update that would drop commits (without `force`).
    NotFastForward = "not_fast_forward", 409;
    /// A tag update that would move an existing tag (without `force`).
    RefExists = "ref_exists", 409;
    /// The input changed while it was committed.
    InputChanged = "input_changed", 409;
    /// Deleting the branch HEAD points at.
    CurrentBranch = "current_branch", 409;
    /// Deleting, without force, a branch whose commits nothing else reaches.
    UnmergedBranch = "unmerged_branch", 409;
    /// Creating what already exists.
    Exists = "exists", 409;
    /// A pack or ref update naming objects the server does not have; send them and retry.
    Incomplete = "incomplete", 409;
    /// A resumed upload whose start the server no longer holds as it was sent: send it whole.
    UploadGone = "upload_gone", 409;
    /// A checkpoint of a thinned commit: retention deleted some of its tensors.
    Expired = "expired", 410;
    /// An upload over the server's body limit.
    BodyTooLarge = "body_too_large", 413;
    /// A commit over one of the repository's limits (tensors or files in one commit, header
    /// bytes: `docs/RELIABILITY.md`), or a manifest too large for one record.
    TooLarge = "too_large", 413;
    /// A Range outside the file.
    InvalidRange = "invalid_range", 416;
    /// The server could not read or write a file.
    IoError = "io_error", 500;
    /// The server's database failed.
    DatabaseError = "database_error", 500;
    /// The server's database is damaged (`mdl fsck --repair` rebuilds it).
    DatabaseDamaged = "database_damaged", 500;
    /// A stored object failed verification.
    CorruptObject = "corrupt_object", 500;
    /// A stored object is missing.
    MissingObject = "missing_object", 500;
    /// The repository was written by a newer mdl.
    NewerFormat = "newer_format", 500;
    /// A failure inside the server.
    Internal = "internal", 500;
    /// What the route asks is not done for this kind of repository (one in object storage).
    Unsupported = "unsupported", 501;
    /// The object storage holding the repository failed, or holds what no mdl wrote.
    StorageError = "storage_error", 502;
    /// `mdl` could not reach the server it was sent to (never sent by a server).
    Unreachable = "unreachable", 502;
    /// A server's answer `mdl` does not take: a name breaking the rules, a document over its
    /// limit, something other than what was asked for, bytes that are not the commit's (never
    /// sent by a server).
    BadAnswer = "bad_answer", 502;
    /// A server did not answer, or a transfer did not finish, within a deadline (never sent by
    /// a server).
    Timeout = "timeout", 504;
    /// The repository is held by another process; try again.
    Busy = "busy", 503;
    /// The repository needs recovery first; try again.
    NeedsRecovery = "needs_recovery", 503;
    /// The server could not allocate what the request needs; try again later.
    OutOfMemory = "out_of_memory", 503;
    /// A commit asked for the GPU engine and the server has none.
    GpuUnavailable = "gpu_unavailable", 503;
}

/// A code this build does not know (sent by a newer server).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownCode(pub String);

impl fmt::Display for UnknownCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown error code {:?}", self.0)
    }
}

impl std::error::Error for UnknownCode {}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for &code in ErrorCode::ALL {
            assert!(seen.insert(code.as_str()), "{code} twice");
            assert_eq!(code.as_str().parse::<ErrorCode>(), Ok(code));
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), code);
            assert!((400..600).contains(&code.status()), "{code}");
        }
        assert!("no_such_code".parse::<ErrorCode>().is_err());
    }

    #[test]
    fn the_documentation_lists_every_code_with_its_status() {
        let doc = include_str!("../../../docs/HTTP_API.md");
        for &code in ErrorCode::ALL {
            let row = doc
                .lines()
                .filter(|l| l.starts_with('|'))
                .find(|l| l.contains(&format!("`{}`", code.as_str())))
                .unwrap_or_else(|| panic!("docs/HTTP_API.md does not list `{code}`"));
            assert!(
                row.starts_with(&format!("| {} |", code.status())),
                "docs/HTTP_API.md lists `{code}` under another status: {row}"
            );
        }
    }
}
