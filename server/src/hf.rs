//! A Hugging Face–compatible read layout of every repository, under `/hf`: with `HF_ENDPOINT`
//! (or `endpoint=`) set to `http://HOST:PORT/hf`, `huggingface_hub`'s `hf_hub_download`,
//! `snapshot_download`, `HfFileSystem` and `hf://` URLs read files of a branch, tag or commit
//! of an mdl repository, its name as the `repo_id` (`namespace/name`, or one segment for a
//! repository at the top of the served folder; names.rs).
//!
//! The routes are the ones the client calls: the model-info and revision routes (the commit a
//! revision resolves to, and its files), the tree listing, `paths-info`, and `resolve` with the
//! headers the client requires (`X-Repo-Commit`, `ETag`, `Content-Length`), `Range` included.
//! Tokens work as on every route (`Authorization: Bearer`, read scope). Refs and history are
//! in `hf_history.rs`, writes in `hf_write.rs` and `hf_lfs.rs`.

use axum::extract::{Form, Path, Query};
use axum::http::{HeaderMap, HeaderName, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use mdl::checkout::Listing;
use serde_json::{json, Value};

use crate::access::{blocking, Access, ApiResult, Reader};
use crate::error::{ApiError, ErrorText};
use crate::files::{file_of, listing_of, serve_file};
use crate::State;
use mdl_protocol::ErrorCode;

/// The prefix the layout is served under.
pub(crate) const PREFIX: &str = "/hf";

/// The header giving the commit a file came from.
const REPO_COMMIT: &str = "x-repo-commit";

/// The routes, to be nested under [`PREFIX`], with `writes` (the write routes, `hf_write`
/// and `hf_lfs`) under the same error headers.
pub(crate) fn routes(writes: Router<std::sync::Arc<State>>) -> Router<std::sync::Arc<State>> {
    Router::new()
        .route("/{repo}/resolve/{rev}/{*path}", get(resolve))
        .route("/api/models/{repo}", get(info_head))
        .route("/api/models/{repo}/revision/{rev}", get(info))
        .route("/api/models/{repo}/tree/{rev}", get(tree_root))
        .route("/api/models/{repo}/tree/{rev}/{*path}", get(tree))
        .route("/api/models/{repo}/paths-info/{rev}", post(paths_info))
        .merge(writes)
        .layer(axum::middleware::map_response(hub_error_headers))
}

/// The Hub's error headers on an error answer, from which `huggingface_hub` raises its own
/// exception classes (`RepositoryNotFoundError`, `RevisionNotFoundError`,
/// `RemoteEntryNotFoundError`) instead of taking a 404 for a network failure. A token the
/// server does not know is said as the Hub says it, so the client does not report a missing
/// repository.
async fn hub_error_headers(mut response: Response) -> Response {
    let Some(code) = response.extensions().get::<ErrorCode>().copied() else {
        return response;
    };
    // The client shows `X-Error-Message` (not the body's `message`) in what it raises.
    if let Some(text) = response.extensions().get::<ErrorText>() {
        if let Ok(value) = header_text(&text.0).parse() {
            response.headers_mut().insert("x-error-message", value);
        }
    }
    let (name, value) = match code {
        ErrorCode::NoSuchRepository => ("x-error-code", "RepoNotFound"),
        ErrorCode::UnknownRevision | ErrorCode::UnbornBranch => {
            ("x-error-code", "RevisionNotFound")
        }
        ErrorCode::NotFound => ("x-error-code", "EntryNotFound"),
        ErrorCode::Unauthorized => (
            "x-error-message",
            "Invalid credentials in Authorization header",
        ),
        _ => return response,
    };
    response
        .headers_mut()
        .insert(name, axum::http::HeaderValue::from_static(value));
    response
}

/// `GET|HEAD /{repo}/resolve/{rev}/{path}`: one file.
async fn resolve(
    Access(served): Reader,
    Path((_, rev, path)): Path<(String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> ApiResult<Response> {
    // A new repository's branch has no commits yet; on the Hub it holds an empty tree, so a
    // file of it is a missing file (which the client expects of a model card it may create).
    let (commit, file, etag) = match file_of(&served, &rev, &path).await {
        Ok(found) => found,
        Err(e) if matches!(e.code, ErrorCode::UnbornBranch | ErrorCode::UnknownRevision) => {
            let (served, named) = (served.clone(), rev.clone());
            let unborn = blocking(move || {
                let head = served.repo.head_branch()?;
                let born = mdl::revision::resolve(&served.repo, "HEAD").is_ok();
                Ok(!born && head.strip_prefix(mdl::Ref::BRANCHES) == Some(named.as_str()))
            })
            .await?;
            return Err(match unborn {
                true => ApiError::not_found(format!("{path}: {rev} has no commits yet")),
                false => e,
            });
        }
        Err(e) => return Err(e),
    };
    let extra = [
        (HeaderName::from_static(REPO_COMMIT), commit.to_hex()),
        (
            HeaderName::from_static(mdl_protocol::route::HEADER_COMMIT),
            commit.to_hex(),
        ),
    ];
    serve_file(served, &method, &headers, file, etag, &extra)
}

/// `GET /api/models/{repo}`: the model info of HEAD's branch.
async fn info_head(access: Reader, Path(repo): Path<String>) -> ApiResult<Response> {
    let Access(served) = &access;
    let head = {
        let served = served.clone();
        blocking(move || Ok(served.repo.head_branch()?)).await?
    };
    let branch = head
        .strip_prefix(mdl::Ref::BRANCHES)
        .unwrap_or(&head)
        .to_string();
    info(access, Path((repo, branch))).await
}

/// `GET /api/models/{repo}/revision/{rev}`: the commit `rev` resolves to, and its files.
async fn info(
    Access(served): Reader,
    Path((repo, rev)): Path<(String, String)>,
) -> ApiResult<Response> {
    let layout = listing_of(&served, rev).await?;
    let time = {
        let served = served.clone();
        let id = layout.commit;
        blocking(move || Ok(served.repo.load_commit(&id)?.time.rfc3339())).await?
    };
    let siblings: Vec<Value> = layout
        .files
        .iter()
        .map(|f| json!({ "rfilename": f.path, "size": f.len }))
        .collect();
    Ok(Json(json!({
        "id": repo,
        "modelId": repo,
        "sha": layout.commit.to_hex(),
        "lastModified": time,
        "private": false,
        "disabled": false,
        "gated": false,
        "tags": [],
        "siblings": siblings,
    }))
    .into_response())
}

#[derive(serde::Deserialize)]
struct TreeQuery {
    #[serde(default)]
    recursive: Option<String>,
}

/// `GET /api/models/{repo}/tree/{rev}`: the top of the tree.
async fn tree_root(
    access: Reader,
    Path((repo, rev)): Path<(String, String)>,
    query: Query<TreeQuery>,
) -> ApiResult<Response> {
    tree(access, Path((repo, rev, String::new())), query).await
}

/// `GET /api/models/{repo}/tree/{rev}/{path}?recursive=`: the files and folders under `path`
/// (all of them when recursive, else its children), in one page.
async fn tree(
    Access(served): Reader,
    Path((_, rev, path)): Path<(String, String, String)>,
    Query(q): Query<TreeQuery>,
) -> ApiResult<Response> {
    let recursive = q
        .recursive
        .as_deref()
        .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    let listed = listing_of(&served, rev.clone()).await?;
    let entries = tree_entries(&listed, path.trim_matches('/'), recursive);
    if entries.is_empty() && !path.trim_matches('/').is_empty() {
        return Err(ApiError::not_found(format!("no folder {path:?} in {rev}")));
    }
    Ok(Json(entries).into_response())
}

/// The entries under `dir` ("" for the root): files with size and content id, and folders.
fn tree_entries(listed: &Listing, dir: &str, recursive: bool) -> Vec<Value> {
    let prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    let mut folders = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for f in &listed.files {
        let Some(rest) = f.path.strip_prefix(&prefix) else {
            continue;
        };
        // Every folder between `dir` and the file (only the first when not recursive).
        let parts: Vec<&str> = rest.split('/').collect();
        let depth = if recursive {
            parts.len() - 1
        } else {
            1.min(parts.len() - 1)
        };
        for n in 1..=depth {
            folders.insert(format!("{prefix}{}", parts[..n].join("/")));
        }
        if recursive || parts.len() == 1 {
            out.push(file_entry(f));
        }
    }
    out.extend(folders.iter().map(|d| folder_entry(d)));
    out
}

/// `text` as a header value: characters outside printable ASCII escaped.
fn header_text(text: &str) -> String {
    text.chars()
        .flat_map(|c| match c {
            ' '..='~' => vec![c],
            c => c.escape_default().collect(),
        })
        .collect()
}

/// `POST /api/models/{repo}/paths-info/{rev}` (form: `paths` repeated, `expand`): the files and
/// folders among `paths` that exist at `rev`, described as the tree describes them; paths
/// that do not exist are left out.
async fn paths_info(
    Access(served): Reader,
    Path((_, rev)): Path<(String, String)>,
    Form(form): Form<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let listed = listing_of(&served, rev).await?;
    // The files by path, so that each of the request's paths is a lookup, not a scan.
    let mut by_path: Vec<&mdl::checkout::ListedFile> = listed.files.iter().collect();
    by_path.sort_by(|a, b| a.path.cmp(&b.path));
    let mut out = Vec::new();
    for (key, path) in &form {
        if key != "paths" {
            continue;
        }
        let path = path.trim_matches('/');
        if let Ok(at) = by_path.binary_search_by(|f| f.path.as_str().cmp(path)) {
            out.push(file_entry(by_path[at]));
        } else if !path.is_empty() {
            // A folder: the first path at or after `path/` starts with it.
            let inside = format!("{path}/");
            let at = by_path.partition_point(|f| f.path.as_str() < inside.as_str());
            if by_path.get(at).is_some_and(|f| f.path.starts_with(&inside)) {
                out.push(folder_entry(path));
            }
        }
    }
    Ok(Json(out).into_response())
}

/// A file as the tree and `paths-info` describe it.
fn file_entry(f: &mdl::checkout::ListedFile) -> Value {
    json!({
        "type": "file",
        "path": f.path,
        "size": f.len,
        "oid": f.content_id.to_hex(),
    })
}

/// A folder as the tree and `paths-info` describe it (its id a hash of its path).
fn folder_entry(path: &str) -> Value {
    let oid = mdl::ObjectId::hash(path.as_bytes()).to_hex();
    json!({ "type": "directory", "path": path, "oid": oid })
}
