//! Every failure as a JSON body `{code, message}` with an HTTP status; the codes are stable
//! (`docs/HTTP_API.md` lists them) and come from one exhaustive match over the library's errors.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use mdl::StoreError;
use serde::Serialize;

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    /// The status.
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// One line for people.
    pub message: String,
}

#[derive(Serialize)]
struct Body<'a> {
    code: &'a str,
    message: &'a str,
}

impl ApiError {
    /// An error with the given status and code.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    /// 400 with a code.
    pub fn bad(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 404 for something that does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 500 for a failure inside the server.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(code = self.code, "{}", self.message);
        }
        let body = serde_json::to_vec(&Body {
            code: self.code,
            message: &self.message,
        })
        .expect("serialisable");
        let mut response = (
            self.status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            // Busy (another process holds the repository) or recovering: worth asking again.
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        response
    }
}

/// The message a client gets for `e`: the library's own, except where it names the server's
/// files or processes (paths of repositories, uploads and records; who holds a lock), which
/// stay in the server's log.
fn public_message(e: &mdl::Error) -> String {
    use mdl::Error as E;
    use StoreError as S;
    let private = match e {
        E::Input { source, .. } => format!("cannot read the upload: {source}"),
        E::InvalidInput { source, .. } => format!("invalid safetensors file: {source}"),
        E::OutputExists(_) | E::Output { .. } | E::OutputInRepository(_) => {
            "the server could not write its output".into()
        }
        E::Store(S::Io { op, source, .. }) => {
            format!("the server could not {op} a repository file: {source}")
        }
        E::Store(S::ReadOnly(_)) => "the repository is read-only".into(),
        E::Store(S::NotARepository(_)) => "no such repository".into(),
        E::Store(S::AlreadyExists(_)) => "the repository already exists".into(),
        E::Store(S::Damaged(_)) => {
            "the repository's database is damaged; `mdl fsck --repair` on the server rebuilds it"
                .into()
        }
        E::Store(S::Busy { waited_secs, .. }) => format!(
            "the repository is in use by another process (waited {waited_secs} s); try again"
        ),
        _ => return e.to_string(),
    };
    tracing::warn!("{e}");
    private
}

impl From<mdl::Error> for ApiError {
    fn from(e: mdl::Error) -> Self {
        use mdl::Error as E;
        use StatusCode as S;
        let message = public_message(&e);
        let (status, code) = match &e {
            E::Store(s) => return store_error(s, message),
            E::Input { .. } => (S::BAD_REQUEST, "bad_input"),
            E::InvalidInput { .. } => (S::BAD_REQUEST, "invalid_safetensors"),
            E::UnknownRevision(_) | E::NoSuchAncestor(_) => (S::NOT_FOUND, "unknown_revision"),
            E::AmbiguousRevision { .. } => (S::BAD_REQUEST, "ambiguous_revision"),
            E::UnbornBranch(_) => (S::NOT_FOUND, "unborn_branch"),
            E::InvalidName(_) => (S::BAD_REQUEST, "invalid_name"),
            E::RefExists { .. } => (S::CONFLICT, "ref_exists"),
            E::NoSuchRef { .. } => (S::NOT_FOUND, "no_such_ref"),
            E::DeleteCurrentBranch(_) => (S::CONFLICT, "current_branch"),
            E::OutputExists(_) | E::Output { .. } | E::OutputInRepository(_) => {
                (S::INTERNAL_SERVER_ERROR, "io_error")
            }
            E::InvalidMetric(_) => (S::BAD_REQUEST, "invalid_metric"),
            E::InvalidConfig { .. } => (S::BAD_REQUEST, "invalid_config"),
            E::UnknownConfig(_) => (S::BAD_REQUEST, "unknown_config"),
            E::EvalCommand { .. } => (S::BAD_REQUEST, "eval_failed"),
            E::Corrupt { .. } | E::WrongKind { .. } => (S::INTERNAL_SERVER_ERROR, "corrupt_object"),
            E::BadTransfer(_) => (S::BAD_REQUEST, "bad_transfer"),
            E::Incomplete(_) => (S::CONFLICT, "incomplete"),
            E::NotFastForward { .. } => (S::CONFLICT, "not_fast_forward"),
            E::Expired { .. } => (S::GONE, "expired"),
            E::InvalidDuration(_) => (S::BAD_REQUEST, "invalid_duration"),
            E::GpuUnavailable(_) => (S::SERVICE_UNAVAILABLE, "gpu_unavailable"),
        };
        ApiError::new(status, code, message)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        mdl::Error::from(e).into()
    }
}

fn store_error(e: &StoreError, message: String) -> ApiError {
    use StatusCode as S;
    use StoreError as E;
    let (status, code) = match e {
        E::Io { .. } | E::Output(_) => (S::INTERNAL_SERVER_ERROR, "io_error"),
        E::Db(_) => (S::INTERNAL_SERVER_ERROR, "database_error"),
        E::Damaged(_) => (S::INTERNAL_SERVER_ERROR, "database_damaged"),
        E::NeedsRecovery => (S::SERVICE_UNAVAILABLE, "needs_recovery"),
        E::Corrupt { .. } => (S::INTERNAL_SERVER_ERROR, "corrupt_object"),
        E::Missing(_) => (S::INTERNAL_SERVER_ERROR, "missing_object"),
        E::Busy { .. } => (S::SERVICE_UNAVAILABLE, "busy"),
        E::OutOfMemory(_) => (S::SERVICE_UNAVAILABLE, "out_of_memory"),
        E::ReadOnly(_) => (S::FORBIDDEN, "read_only"),
        E::NotARepository(_) => (S::NOT_FOUND, "no_such_repository"),
        E::AlreadyExists(_) => (S::CONFLICT, "exists"),
        E::NewerFormat { .. } => (S::INTERNAL_SERVER_ERROR, "newer_format"),
        E::InputChanged(_) => (S::CONFLICT, "input_changed"),
        E::RefConflict { .. } => (S::CONFLICT, "ref_conflict"),
    };
    ApiError::new(status, code, message)
}
