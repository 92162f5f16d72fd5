//! What every repository route needs before it runs: the repository named by `{repo}`, open,
//! and a token of the scope the route requires ([`Access`]); its JSON body and query read into
//! the API's errors ([`json_body`], [`query`]); and a way to run blocking work ([`blocking`]).

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequestParts, Query, RawPathParams};
use axum::http::request::Parts;
use axum::Json;
use mdl_protocol::ErrorCode;

use crate::auth::{check, Scope};
use crate::error::ApiError;
use crate::{valid_repo_name, Served, State};

/// A handler's result: an answer, or an error answered as JSON with its status.
pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// A JSON body, or the API's `bad_request` error saying why it could not be read.
pub(crate) fn json_body<T>(body: Result<Json<T>, JsonRejection>) -> ApiResult<T> {
    body.map(|Json(v)| v)
        .map_err(|e| ApiError::new(ErrorCode::BadRequest, e.body_text()))
}

/// Query parameters, or the API's `bad_request` error saying why they could not be read.
pub(crate) fn query<T>(q: Result<Query<T>, QueryRejection>) -> ApiResult<T> {
    q.map(|Query(v)| v)
        .map_err(|e| ApiError::new(ErrorCode::BadRequest, e.body_text()))
}

/// Runs blocking work (store, codecs) off the async workers.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        // A panic's text stays in the server's log.
        tracing::error!("request worker failed: {e}");
        ApiError::internal("the request failed inside the server (see its log)")
    })?
}

/// A repository the request may use: the `{repo}` path parameter names a valid repository, the
/// request's token has read scope (`WRITE`: write scope), and the repository is open (for a
/// read of one in object storage, up to date with the bucket).
pub(crate) struct Access<const WRITE: bool>(pub(crate) Arc<Served>);
pub(crate) type Reader = Access<false>;
pub(crate) type Writer = Access<true>;

impl<const WRITE: bool> FromRequestParts<Arc<State>> for Access<WRITE> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<State>) -> ApiResult<Self> {
        let params = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::new(ErrorCode::BadRequest, e.body_text()))?;
        let name = params
            .iter()
            .find(|(k, _)| *k == "repo")
            .map(|(_, v)| v.to_string())
            .ok_or_else(|| ApiError::internal("route without a {repo} parameter"))?;
        if !valid_repo_name(&name) {
            return Err(ApiError::new(
                ErrorCode::InvalidRepositoryName,
                format!("invalid repository name {name:?}"),
            ));
        }
        let scope = if WRITE { Scope::Write } else { Scope::Read };
        check(
            &state.config.tokens,
            state.config.read_public,
            &parts.headers,
            scope,
        )?;
        let state = state.clone();
        blocking(move || {
            let served = state.repo(&name)?;
            // A change brings a replica up to date itself, under its turn.
            if !WRITE {
                served.refresh()?;
            }
            Ok(served)
        })
        .await
        .map(Access)
    }
}
