//! Every failure as a JSON body `{code, message}` with an HTTP status; the codes are stable
//! (`docs/HTTP_API.md` lists them) and come from one exhaustive match over the library's errors.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use mdl::StoreError;
use mdl_protocol::{body, ErrorCode};

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    /// The status ([`ErrorCode::status`]).
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub code: ErrorCode,
    /// One line for people.
    pub message: String,
}

impl ApiError {
    /// An error with the given code, sent with the code's status.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::from_u16(code.status()).expect("error codes have valid statuses"),
            code,
            message: message.into(),
        }
    }

    /// 404 for something that does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::NotFound, message)
    }

    /// 500 for a failure inside the server.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::Internal, message)
    }
}

/// An error answer's message, kept beside its body for routes that also say it in a header
/// (the Hub's `X-Error-Message`).
#[derive(Clone)]
pub(crate) struct ErrorText(pub(crate) String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(code = self.code.as_str(), "{}", self.message);
        }
        let message = self.message.clone();
        let body = serde_json::to_vec(&body::Error {
            code: self.code,
            message: self.message,
        })
        .expect("serialisable");
        let mut response = (
            self.status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
        // What a layer may translate the error into (the `/hf` layout's Hub headers).
        response.extensions_mut().insert(self.code);
        response.extensions_mut().insert(ErrorText(message));
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
        E::InvalidInput { source, found, .. } => mdl::not_safetensors(source, found),
        E::DamagedCheckpoint { why, .. } => format!("the upload: {why}"),
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
        ApiError::new(e.code(), public_message(&e))
    }
}

impl From<mdl_bucket::Error> for ApiError {
    fn from(e: mdl_bucket::Error) -> Self {
        use mdl_bucket::Error as E;
        use ErrorCode as C;
        let message = e.to_string();
        match e {
            E::Local(e) => e.into(),
            E::Cache { .. } => {
                // Names the server's files: the log has them.
                tracing::error!("{message}");
                ApiError::new(C::IoError, "the server's copy of the repository failed")
            }
            e => ApiError::new(e.code(), message),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        mdl::Error::from(e).into()
    }
}
