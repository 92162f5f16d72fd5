//! Files of a commit over HTTP: the listing of a commit's tree, and any file of any revision
//! streamed with `Range` (a range decodes only the objects it touches). The checkpoint route
//! (`REV.safetensors`, a commit of one file) and the Hugging Face layout (`crate::hf`) answer
//! through the same [`serve_file`].

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderName, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use mdl::checkout::{FileLayout, Layout, Listing};
use mdl_protocol::{body, route, ErrorCode};

use crate::access::{blocking, ApiResult, Reader};
use crate::budgeted::{self, Held};
use crate::error::ApiError;
use crate::{stream, Served};

/// A Range header no byte of the file satisfies (416).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unsatisfiable;

/// A byte range of a file of `len` bytes asked for by a `Range` header's value: `Ok(None)` for
/// the whole file (no header, or one this server answers with the whole file, like several
/// ranges), `Err` when unsatisfiable.
pub fn parse_range(value: Option<&str>, len: u64) -> Result<Option<(u64, u64)>, Unsatisfiable> {
    let Some(spec) = value.and_then(|v| v.trim().strip_prefix("bytes=")) else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let (a, b) = spec.split_once('-').ok_or(Unsatisfiable)?;
    let (a, b) = (a.trim(), b.trim());
    let (start, end) = if a.is_empty() {
        let n: u64 = b.parse().map_err(|_| Unsatisfiable)?;
        if n == 0 {
            return Err(Unsatisfiable);
        }
        (len.saturating_sub(n), len)
    } else {
        let start: u64 = a.parse().map_err(|_| Unsatisfiable)?;
        let end = if b.is_empty() {
            len
        } else {
            let last: u64 = b.parse().map_err(|_| Unsatisfiable)?;
            if last < start {
                return Err(Unsatisfiable);
            }
            last.saturating_add(1).min(len)
        };
        (start, end)
    };
    if start >= len {
        return Err(Unsatisfiable);
    }
    Ok(Some((start, end)))
}

/// What `read` makes of the commit `rev` names (its files laid out or listed), off the async
/// workers, with `per_byte` times its manifest's length of the decode budget
/// ([`budgeted::hold`]).
async fn held<T: Send + 'static>(
    served: &Arc<Served>,
    rev: String,
    per_byte: u64,
    read: fn(&mdl::Repository, &str) -> mdl::Result<T>,
) -> ApiResult<Held<T>> {
    let served = served.clone();
    blocking(move || {
        let repo = &served.repo;
        Ok(budgeted::hold(repo, &rev, per_byte, |c| {
            read(repo, &c.to_hex())
        })?)
    })
    .await
}

/// The layout of `rev`'s files (nothing decoded), with its share of the decode budget.
pub(crate) async fn layout_of(served: &Arc<Served>, rev: String) -> ApiResult<Held<Layout>> {
    held(served, rev, budgeted::LAYOUT, mdl::checkout::layout).await
}

/// `file` of a commit as an HTTP answer: `HEAD` or `GET`, `If-None-Match` against `etag`,
/// one `Range` (honoured while `If-Range` matches `etag`), the bytes streamed.
pub(crate) fn serve_file(
    served: Arc<Served>,
    method: &Method,
    headers: &HeaderMap,
    file: FileLayout,
    etag: String,
    extra: &[(HeaderName, String)],
) -> ApiResult<Response> {
    if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"))
    {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response());
    }
    let len = file.len;
    let if_range_ok = headers
        .get(header::IF_RANGE)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|v| v.trim() == etag);
    let range = if if_range_ok {
        parse_range(
            headers.get(header::RANGE).and_then(|v| v.to_str().ok()),
            len,
        )
    } else {
        Ok(None)
    };
    let (status, start, end) = match range {
        Ok(None) => (StatusCode::OK, 0, len),
        Ok(Some((s, e))) => (StatusCode::PARTIAL_CONTENT, s, e),
        Err(Unsatisfiable) => {
            return Ok((
                StatusCode::RANGE_NOT_SATISFIABLE,
                [(header::CONTENT_RANGE, format!("bytes */{len}"))],
                ApiError::new(
                    ErrorCode::InvalidRange,
                    format!("the range is not within the file's {len} bytes"),
                ),
            )
                .into_response());
        }
    };
    let mut response = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, end - start)
        .header(header::ETAG, &etag)
        .header(header::ACCEPT_RANGES, "bytes")
        .header(route::HEADER_LOSSY_TENSORS, file.lossy_tensors());
    for (name, value) in extra {
        response = response.header(name, value);
    }
    if status == StatusCode::PARTIAL_CONTENT {
        response = response.header(
            header::CONTENT_RANGE,
            format!("bytes {start}-{}/{len}", end - 1),
        );
    }
    let body = if method == Method::HEAD || start == end {
        Body::empty()
    } else {
        stream::file_range(served, Arc::new(file), start, end)
    };
    response
        .body(body)
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// `GET /checkpoints/REV.safetensors`: a commit of one file, that file (its ETag the commit).
pub(crate) async fn checkpoint(
    crate::access::Access(served): Reader,
    Path((_, file)): Path<(String, String)>,
    method: Method,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let Some(rev) = file.strip_suffix(".safetensors").map(str::to_string) else {
        return Err(ApiError::not_found("checkpoints are named REV.safetensors"));
    };
    let layout = layout_of(&served, rev.clone()).await?;
    let commit = layout.commit;
    let Some(file) = layout.single().cloned() else {
        return Err(ApiError::not_found(format!(
            "{rev} holds {} files, not one checkpoint file; download them from {}",
            layout.files.len(),
            route::FILES
        )));
    };
    // Its share of the budget goes back before the file's tensors reserve theirs.
    drop(layout);
    let extra = [(
        HeaderName::from_static(route::HEADER_COMMIT),
        commit.to_hex(),
    )];
    serve_file(
        served,
        &method,
        &headers,
        file,
        format!("\"{commit}\""),
        &extra,
    )
}

/// The listing of `rev`'s files (read from its manifest in place, nothing laid out), with its
/// share of the decode budget.
pub(crate) async fn listing_of(served: &Arc<Served>, rev: String) -> ApiResult<Held<Listing>> {
    held(served, rev, budgeted::LISTED, mdl::checkout::listing).await
}

/// `GET /files/REV`: the commit's files.
pub(crate) async fn list(
    crate::access::Access(served): Reader,
    Path((_, rev)): Path<(String, String)>,
) -> ApiResult<Response> {
    let listed = listing_of(&served, rev).await?;
    Ok(Json(body::Files {
        commit: listed.commit,
        files: listed
            .files
            .iter()
            .map(|f| body::ListedFile {
                path: f.path.clone(),
                size: f.len,
                etag: f.content_id,
                tensors: f.tensors,
                lossy_tensors: f.lossy_tensors,
                executable: f.executable,
            })
            .collect(),
    })
    .into_response())
}

/// The file `path` of the commit `rev` resolves to, with that commit, and its ETag (the
/// content's id).
pub(crate) async fn file_of(
    served: &Arc<Served>,
    rev: &str,
    path: &str,
) -> ApiResult<(mdl::ObjectId, FileLayout, String)> {
    let layout = layout_of(served, rev.to_string()).await?;
    let Some(file) = layout.file(path).cloned() else {
        return Err(ApiError::not_found(format!("no file {path:?} in {rev}")));
    };
    let etag = format!("\"{}\"", file.content_id());
    Ok((layout.commit, file, etag))
}

/// `GET|HEAD /files/REV/PATH`: one file (its ETag its content's id).
pub(crate) async fn file(
    crate::access::Access(served): Reader,
    Path((_, rev, path)): Path<(String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (commit, file, etag) = file_of(&served, &rev, &path).await?;
    let extra = [(
        HeaderName::from_static(route::HEADER_COMMIT),
        commit.to_hex(),
    )];
    serve_file(served, &method, &headers, file, etag, &extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range(None, 10), Ok(None));
        assert_eq!(parse_range(Some("bytes=0-3"), 10), Ok(Some((0, 4))));
        assert_eq!(parse_range(Some("bytes=5-"), 10), Ok(Some((5, 10))));
        assert_eq!(parse_range(Some("bytes=-3"), 10), Ok(Some((7, 10))));
        assert_eq!(parse_range(Some("bytes=-30"), 10), Ok(Some((0, 10))));
        assert_eq!(parse_range(Some("bytes=8-100"), 10), Ok(Some((8, 10))));
        assert_eq!(parse_range(Some("bytes=0-1,4-5"), 10), Ok(None));
        assert_eq!(parse_range(Some("bytes=10-"), 10), Err(Unsatisfiable));
        assert_eq!(parse_range(Some("bytes=5-4"), 10), Err(Unsatisfiable));
        assert_eq!(parse_range(Some("bytes=-0"), 10), Err(Unsatisfiable));
        assert_eq!(parse_range(Some("bytes=x-1"), 10), Err(Unsatisfiable));
        assert_eq!(parse_range(Some("items=0-1"), 10), Ok(None));
    }
}
