//! Request bodies taken to disk: an upload streamed into a temporary file in the
//! repository's `incoming/`, bounded, its `Content-Length` checked (commits of a file or a
//! tree, the Hub API's commits, LFS objects, packs; what arrived of a pack that broke off is
//! given back to be kept, `resumable.rs`).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap};
use mdl_protocol::ErrorCode;
use tokio_stream::StreamExt;

use crate::access::{blocking, ApiResult};
use crate::error::ApiError;
use crate::Served;

/// Room an upload leaves free on the repository's disk: the commit it is for writes too, and
/// the rest of the machine needs its disk. At most a sixteenth of a small disk.
const SPARE_ROOM: u64 = 256 << 20;

/// How often (in bytes received) an upload looks at the free space again.
const ROOM_CHECK_EVERY: u64 = 64 << 20;

/// Streams a request body into a temporary file in the repository's `incoming/` directory,
/// refusing more than `max` bytes, and more than leaves [`SPARE_ROOM`] (or a sixteenth of a
/// smaller disk) free on its disk
/// (known at once from a `Content-Length`, or met while it arrives): a body that would fill
/// the disk is refused (413) before it does, not written until `No space left on device`.
pub(crate) async fn spool(
    served: &Arc<Served>,
    headers: &HeaderMap,
    body: Body,
    max: u64,
) -> ApiResult<tempfile::NamedTempFile> {
    spool_keeping(served, headers, body, max)
        .await
        .map_err(|broken| broken.error)
}

/// Why [`spool_keeping`] failed, with what arrived of a body that broke off (or was shorter
/// than its `Content-Length`), all of it written to the file.
pub(crate) struct Broken {
    pub(crate) error: ApiError,
    pub(crate) arrived: Option<tempfile::NamedTempFile>,
}

impl From<ApiError> for Broken {
    fn from(error: ApiError) -> Self {
        Broken {
            error,
            arrived: None,
        }
    }
}

/// [`spool`], giving back what arrived of a body that broke off.
pub(crate) async fn spool_keeping(
    served: &Arc<Served>,
    headers: &HeaderMap,
    body: Body,
    max: u64,
) -> Result<tempfile::NamedTempFile, Broken> {
    let too_large = || {
        ApiError::new(
            ErrorCode::BodyTooLarge,
            format!("the request body is over the server's limit of {max} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(too_large().into());
    }
    let tmp = {
        let served = served.clone();
        blocking(move || Ok(served.repo.incoming_file(".upload-")?)).await?
    };
    let dir = tmp
        .path()
        .parent()
        .map(ToOwned::to_owned)
        .unwrap_or_default();
    let spare = mdl::disk_bytes(&dir).map_or(SPARE_ROOM, |size| SPARE_ROOM.min(size / 16));
    let no_room = |bytes: u64| {
        let free = mdl::free_bytes(&dir)?;
        (bytes.saturating_add(spare) > free).then(|| {
            ApiError::new(
                ErrorCode::BodyTooLarge,
                format!(
                    "the request body ({bytes} bytes or more) would leave less than {spare} bytes free on the server's disk ({free} bytes free)"
                ),
            )
        })
    };
    if let Some(e) = declared.and_then(no_room) {
        return Err(e.into());
    }
    let file = tmp
        .reopen()
        .map_err(|e| ApiError::internal(format!("cannot open the upload file: {e}")))?;
    let mut file = tokio::io::BufWriter::with_capacity(1 << 20, tokio::fs::File::from_std(file));
    let mut stream = body.into_data_stream();
    let mut total = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => {
                let flushed = tokio::io::AsyncWriteExt::flush(&mut file).await;
                return Err(Broken {
                    error: body_error(e),
                    arrived: flushed.is_ok().then_some(tmp),
                });
            }
        };
        let before = total;
        total += chunk.len() as u64;
        if total > max {
            return Err(too_large().into());
        }
        if declared.is_none() && total / ROOM_CHECK_EVERY != before / ROOM_CHECK_EVERY {
            if let Some(e) = no_room(ROOM_CHECK_EVERY.min(spare)) {
                return Err(e.into());
            }
        }
        tokio::io::AsyncWriteExt::write_all(&mut file, &chunk)
            .await
            .map_err(|e| ApiError::internal(format!("writing the upload file: {e}")))?;
    }
    tokio::io::AsyncWriteExt::flush(&mut file)
        .await
        .map_err(|e| ApiError::internal(format!("writing the upload file: {e}")))?;
    if declared.is_some_and(|n| n != total) {
        return Err(Broken {
            error: ApiError::new(
                ErrorCode::BadBody,
                "the body is shorter than its Content-Length",
            ),
            arrived: Some(tmp),
        });
    }
    Ok(tmp)
}

/// Why reading a request body failed: a client that stopped sending (408), or one that
/// broke off (400).
fn body_error(e: axum::Error) -> ApiError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(c) = cause {
        if c.is::<tower_http::timeout::TimeoutError>() {
            return ApiError::new(
                ErrorCode::RequestTimeout,
                "the request body stopped arriving",
            );
        }
        cause = c.source();
    }
    ApiError::new(ErrorCode::BadBody, format!("reading the body: {e}"))
}
