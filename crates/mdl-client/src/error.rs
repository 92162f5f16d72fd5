//! What can go wrong talking to a server.

use std::path::PathBuf;

use mdl_protocol::ErrorCode;

/// What can go wrong talking to a server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with an error.
    #[error("server: {message} ({}, HTTP {status})", code.map_or("no known error code", ErrorCode::as_str))]
    Server {
        /// HTTP status.
        status: u16,
        /// The server's stable error code; `None` for an answer without one this build knows
        /// (a newer server's, or not mdl's), whose text is then in the message.
        code: Option<ErrorCode>,
        /// Its message.
        message: String,
    },
    /// The server could not be reached or the connection failed.
    #[error("cannot reach {url}: {why}")]
    Transport {
        /// The URL.
        url: String,
        /// What failed.
        why: String,
    },
    /// The server answered with what mdl does not take: a name breaking the rules, a document
    /// over its limit, something other than what was asked for, bytes that are not the
    /// commit's. Nothing of the answer was used.
    #[error("{url} answered with what mdl does not take: {why}")]
    Answer {
        /// The repository's URL.
        url: String,
        /// What was wrong with it.
        why: String,
    },
    /// The server did not answer, or a transfer did not finish, within a deadline.
    #[error("{url}: {what} ({setting})")]
    Deadline {
        /// The repository's URL.
        url: String,
        /// What it was waiting for, and how long.
        what: String,
        /// The setting that sets the deadline.
        setting: &'static str,
    },
    /// A deadline set in the environment that cannot be read (`MDL_REMOTE_…`).
    #[error("invalid setting in the environment: {0}")]
    Config(String),
    /// A URL that is not `http://HOST:PORT/REPO`.
    #[error("invalid repository URL {0:?}: expected http://HOST:PORT/REPO")]
    BadUrl(String),
    /// A file to upload could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Input {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// What a download was written to failed.
    #[error("cannot write {what}: {source}")]
    Output {
        /// What was being written.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl Error {
    /// Its stable code: the server's, or the one this failure has on this side.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Server { code, .. } => code.unwrap_or(ErrorCode::Internal),
            Error::Transport { .. } => ErrorCode::Unreachable,
            Error::Answer { .. } => ErrorCode::BadAnswer,
            Error::Deadline { .. } => ErrorCode::Timeout,
            Error::BadUrl(_) => ErrorCode::Usage,
            Error::Config(_) => ErrorCode::InvalidConfig,
            Error::Input { .. } => ErrorCode::BadInput,
            Error::Output { .. } => ErrorCode::IoError,
        }
    }
}

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_read_as_their_code_or_say_they_have_none() {
        let known = Error::Server {
            status: 409,
            code: Some(ErrorCode::NotFastForward),
            message: "behind".into(),
        };
        assert_eq!(
            known.to_string(),
            "server: behind (not_fast_forward, HTTP 409)"
        );
        assert_eq!(known.code(), ErrorCode::NotFastForward);
        let unknown = Error::Server {
            status: 502,
            code: None,
            message: "bad gateway".into(),
        };
        assert!(unknown.to_string().contains("no known error code"));
        assert_eq!(unknown.code(), ErrorCode::Internal);
    }
}
