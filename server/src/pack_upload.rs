//! Pack uploads (`POST /objects`, a push): spooled, then received and published; and resumed
//! (`docs/HTTP_API.md`, `x-mdl-upload`): what arrived of a push cut off is kept as
//! `incoming/upload-KEY`, KEY the blake3 hash of the whole pack that the client names, and an
//! upload with that key may send only the rest (`x-mdl-upload-offset`). The pack joined from
//! the two must hash to its key before it is received, so a start kept from another pack, or
//! damaged here, is never taken for this one: the answer is 409 `upload_gone`, and the client
//! sends the pack whole. Nothing is held for a client that never comes back but the file, which
//! gc removes after an hour like any upload left in `incoming/`.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State as AxState};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use mdl::{transfer, ObjectId};
use mdl_protocol::{body, route, ErrorCode};

use crate::access::{blocking, Access, ApiResult, Writer};
use crate::error::ApiError;
use crate::upload::spool_keeping;
use crate::{Served, State};

/// `POST /objects`: a pack spooled, joined to the start kept of the same pack where it goes on
/// from one, then received (every record verified) and its records published.
pub(crate) async fn receive(
    AxState(state): AxState<Arc<State>>,
    Access(served): Writer,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let max = state.config.max_body;
    let upload = Upload::of(&headers)?;
    let spooled = match spool_keeping(&served, &headers, body, max).await {
        Ok(spooled) => spooled,
        Err(broken) => {
            if let (Some(up), Some(arrived)) = (upload, broken.arrived) {
                let served = served.clone();
                blocking(move || {
                    keep(&served, up, arrived);
                    Ok(())
                })
                .await?;
            }
            return Err(broken.error);
        }
    };
    blocking(move || {
        let file = std::fs::File::open(spooled.path())
            .map_err(|e| ApiError::internal(format!("cannot read the upload: {e}")))?;
        // No record in the pack can be longer than the pack itself.
        let (pack, len) = joined(&served, upload, file)?;
        let mut pack = std::io::BufReader::with_capacity(1 << 20, pack);
        let received = served.change(false, |repo| {
            let _writer = repo.writer();
            Ok(transfer::receive_pack(repo, &mut pack, len)?)
        });
        if let Some(up) = &upload {
            forget(&served, &up.key);
        }
        let (receipt, _) = received?;
        let ids: Vec<ObjectId> = receipt.frames.iter().map(|f| f.id).collect();
        served.publish_records(&ids)?;
        Ok(Json(receipt.received).into_response())
    })
    .await
}

/// `GET /objects/uploads/{key}`: how much of the pack of `key` is kept.
pub(crate) async fn held(
    Access(served): Writer,
    Path((_, key)): Path<(String, String)>,
) -> ApiResult<Json<body::UploadHeld>> {
    let key: ObjectId = key
        .parse()
        .map_err(|_| ApiError::new(ErrorCode::InvalidId, "not 64 hex digits"))?;
    blocking(move || {
        Ok(Json(body::UploadHeld {
            held: kept_len(&served, &key)?,
        }))
    })
    .await
}

/// Fewer bytes than this of a pack cut off are not kept.
const MIN_KEPT: u64 = 1 << 20;

/// A pack upload that may be resumed: its key, and where in the pack its body starts.
#[derive(Clone, Copy, Debug)]
struct Upload {
    key: ObjectId,
    offset: u64,
}

impl Upload {
    /// The upload the headers describe, if they name a key.
    fn of(headers: &HeaderMap) -> Result<Option<Upload>, ApiError> {
        let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or(""));
        let Some(key) = header(route::HEADER_UPLOAD) else {
            return Ok(None);
        };
        let key = key.parse().map_err(|_| {
            ApiError::new(
                ErrorCode::InvalidId,
                format!("{}: not 64 hex digits", route::HEADER_UPLOAD),
            )
        })?;
        let offset = match header(route::HEADER_UPLOAD_OFFSET) {
            None => 0,
            Some(n) => n.parse().map_err(|_| {
                ApiError::new(
                    ErrorCode::BadRequest,
                    format!("{}: not a byte offset", route::HEADER_UPLOAD_OFFSET),
                )
            })?,
        };
        Ok(Some(Upload { key, offset }))
    }
}

/// Where the start of the pack of `key` is kept.
fn kept(served: &Served, key: &ObjectId) -> Result<PathBuf, ApiError> {
    Ok(served.repo.incoming_path()?.join(format!("upload-{key}")))
}

/// How much of the pack of `key` is kept: where an upload of it may go on from.
fn kept_len(served: &Served, key: &ObjectId) -> Result<u64, ApiError> {
    Ok(std::fs::metadata(kept(served, key)?).map_or(0, |m| m.len()))
}

/// The pack an upload completes, as one reader with its length: the kept start then what this
/// request sent (`spooled`), checked against the key; or what it sent alone.
fn joined(
    served: &Served,
    upload: Option<Upload>,
    spooled: std::fs::File,
) -> Result<(Box<dyn Read + Send>, u64), ApiError> {
    let sent = spooled.metadata().map(|m| m.len()).unwrap_or(0);
    let Some(up) = upload.filter(|u| u.offset > 0) else {
        return Ok((Box::new(spooled), sent));
    };
    let gone = |why: &str| {
        ApiError::new(
            ErrorCode::UploadGone,
            format!(
                "the upload goes on from byte {}, but {why}: send it whole",
                up.offset
            ),
        )
    };
    let path = kept(served, &up.key)?;
    let start = std::fs::File::open(&path).map_err(|_| gone("nothing of it is held"))?;
    if start.metadata().map(|m| m.len()).ok() != Some(up.offset) {
        return Err(gone("another length of it is held"));
    }
    let joined = ObjectId::hash_reader(&mut (&start).chain(&spooled))
        .map_err(|e| ApiError::internal(format!("cannot read the upload: {e}")))?;
    if joined != up.key {
        forget(served, &up.key);
        return Err(gone("what is held and what came do not hash to its key"));
    }
    let rewind = |mut f: std::fs::File| {
        std::io::Seek::rewind(&mut f)
            .map(|()| f)
            .map_err(|e| ApiError::internal(format!("cannot read the upload: {e}")))
    };
    let reader = rewind(start)?.chain(rewind(spooled)?);
    Ok((Box::new(reader), up.offset + sent))
}

/// Keeps what arrived of a pack upload that broke off (`arrived`, after its kept start when it
/// went on from one), for an upload with the same key to go on from.
fn keep(served: &Served, up: Upload, arrived: tempfile::NamedTempFile) {
    let Ok(path) = kept(served, &up.key) else {
        return;
    };
    let came = arrived.as_file().metadata().map_or(0, |m| m.len());
    let kept_len = std::fs::metadata(&path).map_or(0, |m| m.len());
    let kept = if up.offset == 0 {
        (came >= MIN_KEPT && arrived.persist(&path).is_ok()).then_some(came)
    } else if kept_len == up.offset {
        append(&path, arrived).ok().map(|()| up.offset + came)
    } else {
        None
    };
    if let Some(n) = kept {
        tracing::info!(key = %up.key, held = n, "kept the start of a pack upload cut off");
    }
}

/// Appends the bytes of `arrived` to the file at `path`.
#[allow(clippy::disallowed_methods)] // this module's own `incoming/upload-KEY` files
fn append(path: &std::path::Path, arrived: tempfile::NamedTempFile) -> std::io::Result<()> {
    let mut to = std::fs::OpenOptions::new().append(true).open(path)?;
    std::io::copy(&mut arrived.reopen()?, &mut to)?;
    Ok(())
}

/// Removes the kept start of the pack of `key` (received, refused, or not what it claims).
#[allow(clippy::disallowed_methods)] // this module's own `incoming/upload-KEY` files
fn forget(served: &Served, key: &ObjectId) {
    if let Ok(path) = kept(served, key) {
        let _ = std::fs::remove_file(path);
    }
}
