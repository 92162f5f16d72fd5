//! git LFS's basic transfer, for `huggingface_hub`'s large files, when `mdl serve
//! --hf-lfs-from SIZE` is given: preupload then says `lfs` for files of at least SIZE, which the
//! client uploads one PUT each (streamed from disk, not base64 in the commit) before naming
//! them in the commit by SHA-256. The client does so only without Xet (`HF_HUB_DISABLE_XET=1`,
//! or `hf_xet` not installed); with it, it uploads through Xet (`hf_xet.rs`), which stages
//! the files it rebuilds here the same way.
//!
//! The batch answer's upload address carries a ticket (a keyed hash of the repository, object,
//! size and expiry under a key of this process), since the client sends no token with the PUT.
//! An uploaded object waits in the repository's `incoming/` as `lfs-OID` until a commit names
//! it (one left a day is removed by the next batch; gc removes what is left).

use std::path::{Path as FsPath, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Path, Query, State as AxState};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, put};
use axum::{Json, Router};
use mdl_protocol::ErrorCode;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::Digest;

use crate::access::{blocking, Access, ApiResult, Writer};
use crate::auth::{check, Scope};
use crate::error::ApiError;
use crate::upload::spool;
use crate::{Served, State};

type Shared = AxState<std::sync::Arc<State>>;

/// How long a batch answer's upload address is good for.
const TICKET_LIFETIME: Duration = Duration::from_secs(3600);

/// A staged object older than this is removed by the next batch request.
const STALE: Duration = Duration::from_secs(24 * 3600);

/// The LFS routes, nested under `/hf` with the others.
pub(crate) fn routes() -> Router<std::sync::Arc<State>> {
    Router::new()
        .route("/{repo_git}/info/lfs/objects/batch", post(batch))
        .route("/.lfs/{repo}/{oid}", put(upload))
        .route("/.lfs/{repo}/{oid}/verify", post(verify))
}

/// The name of a staged object in a repository's `incoming/`.
pub(crate) fn staged_path(served: &Served, oid: &str) -> ApiResult<PathBuf> {
    if oid.len() != 64
        || !oid
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            format!("{oid:?} is not a SHA-256 in lowercase hex"),
        ));
    }
    Ok(served.repo.incoming_path()?.join(format!("lfs-{oid}")))
}

fn key() -> &'static [u8; 32] {
    static KEY: OnceLock<[u8; 32]> = OnceLock::new();
    KEY.get_or_init(|| {
        let seed = crate::random_token().unwrap_or_else(|_| format!("{:?}", SystemTime::now()));
        *blake3::hash(seed.as_bytes()).as_bytes()
    })
}

pub(crate) fn ticket(repo: &str, oid: &str, size: u64, expires: u64) -> String {
    let message = format!("{repo}\n{oid}\n{size}\n{expires}");
    blake3::keyed_hash(key(), message.as_bytes())
        .to_hex()
        .to_string()
}

pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `POST /{repo}.git/info/lfs/objects/batch` (write scope): where to upload each object, or
/// nothing for one already staged.
async fn batch(
    AxState(state): Shared,
    Path(repo_git): Path<String>,
    headers: HeaderMap,
    body: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> ApiResult<Response> {
    let bad = |why: &str| ApiError::new(ErrorCode::BadRequest, why);
    let name = repo_git
        .strip_suffix(".git")
        .ok_or_else(|| ApiError::not_found("no such route"))?
        .to_string();
    check(&state.config.tokens, false, &headers, Scope::Write)?;
    let req = crate::access::json_body(body)?;
    if req.get("operation").and_then(Value::as_str) != Some("upload") {
        return Err(bad(
            "mdl serve takes LFS uploads only (downloads go through /resolve)",
        ));
    }
    let objects: Vec<(String, u64)> = req
        .get("objects")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("the request lists no objects"))?
        .iter()
        .map(|o| {
            Some((
                o.get("oid")?.as_str()?.to_string(),
                o.get("size")?.as_u64()?,
            ))
        })
        .collect::<Option<_>>()
        .ok_or_else(|| bad("each object needs an oid and a size"))?;
    let origin = crate::web::origin(&headers);
    let state2 = state.clone();
    let named = name.clone();
    let staged = blocking(move || {
        let served = state2.repo(&named)?;
        sweep(&served);
        objects
            .into_iter()
            .map(|(oid, size)| {
                let path = staged_path(&served, &oid)?;
                let have = std::fs::metadata(&path).is_ok_and(|m| m.len() == size);
                Ok((oid, size, have))
            })
            .collect::<ApiResult<Vec<_>>>()
    })
    .await?;
    let expires = now() + TICKET_LIFETIME.as_secs();
    let answer: Vec<Value> = staged
        .into_iter()
        .map(|(oid, size, have)| {
            if have {
                return json!({ "oid": oid, "size": size });
            }
            let href = format!(
                "{origin}/hf/.lfs/{}/{oid}?size={size}&expires={expires}&ticket={}",
                mdl_protocol::route::segment(&name),
                ticket(&name, &oid, size, expires)
            );
            json!({
                "oid": oid,
                "size": size,
                "authenticated": true,
                "actions": {
                    "upload": { "href": href, "expires_in": TICKET_LIFETIME.as_secs() },
                    "verify": { "href": format!("{origin}/hf/.lfs/{}/{oid}/verify", mdl_protocol::route::segment(&name)) },
                },
            })
        })
        .collect();
    Ok((
        [("content-type", "application/vnd.git-lfs+json")],
        Json(json!({ "transfer": "basic", "objects": answer, "hash_algo": "sha256" })),
    )
        .into_response())
}

/// Removes staged objects a commit took (their bytes are in its records now).
#[allow(clippy::disallowed_methods)] // this module's own `incoming/lfs-OID` files
pub(crate) fn unstage<'a>(paths: impl Iterator<Item = &'a FsPath>) {
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}

/// Removes staged objects (and Xet's xorbs, `hf_xet.rs`) no commit named for a day.
pub(crate) fn sweep(served: &Served) {
    let Ok(dir) = served.repo.incoming_path() else {
        return;
    };
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let stale = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > STALE));
        let name = entry.file_name().to_string_lossy().into_owned();
        if stale && (name.starts_with("lfs-") || name.starts_with("xet-")) {
            unstage(std::iter::once(entry.path().as_path()));
        }
    }
}

#[derive(Deserialize)]
struct Ticket {
    size: u64,
    expires: u64,
    ticket: String,
}

/// `PUT /.lfs/{repo}/{oid}?size&expires&ticket`: the object's bytes, checked against its
/// SHA-256 and size, staged for a commit.
async fn upload(
    AxState(state): Shared,
    Path((name, oid)): Path<(String, String)>,
    Query(t): Query<Ticket>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    if t.expires < now() || ticket(&name, &oid, t.size, t.expires) != t.ticket {
        return Err(ApiError::new(
            ErrorCode::Unauthorized,
            "the upload address is not valid (expired, or not this server's): ask the batch endpoint again",
        ));
    }
    let served = {
        let state = state.clone();
        let name = name.clone();
        blocking(move || Ok(state.repo(&name)?)).await?
    };
    let spooled = spool(&served, &headers, body, state.config.max_body).await?;
    blocking(move || {
        let target = staged_path(&served, &oid)?;
        let (len, digest) = sha256(spooled.path())?;
        if len != t.size || digest != oid {
            return Err(ApiError::new(
                ErrorCode::BadBody,
                format!("the upload is {len} bytes with SHA-256 {digest}, not the {} bytes of {oid} announced", t.size),
            ));
        }
        spooled
            .persist(&target)
            .map_err(|e| ApiError::internal(format!("staging the upload: {e}")))?;
        Ok(StatusCode::OK.into_response())
    })
    .await
}

fn sha256(path: &FsPath) -> ApiResult<(u64, String)> {
    let mut file = std::fs::File::open(path)
        .map_err(|e| ApiError::internal(format!("reading the upload: {e}")))?;
    let mut hasher = sha2::Sha256::new();
    let len = std::io::copy(&mut file, &mut hasher)
        .map_err(|e| ApiError::internal(format!("reading the upload: {e}")))?;
    let digest: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok((len, digest))
}

/// `POST /.lfs/{repo}/{oid}/verify` `{oid, size}` (write scope): whether the object is staged.
async fn verify(
    Access(served): Writer,
    Path((_, oid)): Path<(String, String)>,
    body: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> ApiResult<Response> {
    let req = crate::access::json_body(body)?;
    let size = req.get("size").and_then(Value::as_u64);
    blocking(move || {
        let path = staged_path(&served, &oid)?;
        match std::fs::metadata(&path) {
            Ok(m) if Some(m.len()) == size => Ok(Json(json!({})).into_response()),
            _ => Err(ApiError::not_found(format!(
                "object {oid} was not uploaded"
            ))),
        }
    })
    .await
}
