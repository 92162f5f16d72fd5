//! The Hugging Face Hub's write routes, under `/hf` beside the read layout (`hf.rs`), so that
//! `huggingface_hub.HfApi` publishes to mdl with `HF_ENDPOINT=http://HOST:PORT/hf`:
//! `create_repo` (a repository in the served folder, admin scope), `upload_file`,
//! `upload_folder` and `create_commit` (each one mdl commit that changes those files of the
//! branch's tree, stored per tensor like any commit: a fine-tune of a base already in the
//! repository dedupes and deltas against it), `create_branch` and `create_tag` (refs). Write
//! scope for all but `create_repo`.
//!
//! Small files travel inline in the commit request (preupload answers `regular`); files of at
//! least `mdl serve --hf-lfs-from SIZE` (10 MiB by default) are uploaded first, through Xet
//! (`hf_xet.rs`) by a client with `hf_xet`, through git LFS (`hf_lfs.rs`) by one without
//! (docs/DECISIONS.md).

use axum::body::Body;
use axum::extract::{Path, State as AxState};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use mdl::commit::CommitOptions;
use mdl_protocol::ErrorCode;
use serde_json::{json, Value};

use crate::access::{blocking, json_body, Access, ApiResult, Writer};
use crate::auth::{check, Scope};
use crate::error::ApiError;
use crate::hf_changes::{bad, read_changes, MaxFiles};
use crate::upload::spool;
use crate::State;

type Shared = AxState<std::sync::Arc<State>>;

/// The write routes, nested under `/hf` with the read ones.
pub(crate) fn routes() -> Router<std::sync::Arc<State>> {
    Router::new()
        .route("/api/repos/create", post(create_repo))
        .route("/api/validate-yaml", post(validate_yaml))
        .route("/api/models/{repo}/preupload/{rev}", post(preupload))
        .route("/api/models/{repo}/commit/{rev}", post(commit))
        .route("/api/models/{repo}/branch/{branch}", post(create_branch))
        .route("/api/models/{repo}/tag/{rev}", post(create_tag))
}

/// `POST /api/repos/create` `{"name", "organization"?, "type"?}`: a new repository
/// `organization/name` — without an organization, in the namespace of the token's holder, as
/// the Hub does. The answer's `url` is absolute, so the client reads the id back from it.
async fn create_repo(
    AxState(state): Shared,
    headers: HeaderMap,
    b: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> ApiResult<Response> {
    let req = json_body(b)?;
    let tokens = &state.config.tokens;
    check(tokens, state.config.read_public, &headers, Scope::Read)?;
    let admin = check(tokens, false, &headers, Scope::Admin);
    if req
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| t != "model")
    {
        return Err(bad(
            "mdl serves model repositories only (repo_type=\"model\")",
        ));
    }
    let name = req
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("the request names no repository (\"name\")"))?;
    let namespace = match req.get("organization").and_then(Value::as_str) {
        Some(org) => org.to_string(),
        None => tokens
            .holder(&headers)
            .ok_or_else(|| bad("no token names a namespace: give repo_id as namespace/name"))?,
    };
    let name = format!("{namespace}/{name}");
    let made = name.clone();
    let url = format!(
        "{}{}/{name}",
        crate::web::origin(&headers),
        crate::hf::PREFIX
    );
    match blocking(move || state.create_repo(&made, admin)).await {
        Ok(()) => Ok(Json(json!({ "url": url, "name": name })).into_response()),
        // As the Hub answers: the client's `exist_ok` reads the URL from the conflict.
        Err(e) if e.code == ErrorCode::Exists => Ok((
            e.status,
            [("x-error-message", "You already created this model repo")],
            Json(json!({ "error": e.message, "code": e.code, "url": url })),
        )
            .into_response()),
        Err(e) => Err(e),
    }
}

/// `POST /api/validate-yaml`: the client asks before uploading a `README.md`; mdl keeps the
/// model card as a file and does not interpret its metadata, so nothing is ever wrong with it.
async fn validate_yaml() -> Response {
    Json(json!({ "errors": [], "warnings": [] })).into_response()
}

/// `POST /api/models/{repo}/preupload/{rev}` `{"files": [{"path", "size", "sample"}]}`: how each
/// file is to be sent — inline in the commit, or through LFS when it is at least
/// `--hf-lfs-from`.
async fn preupload(
    AxState(state): Shared,
    Access(_): Writer,
    b: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> ApiResult<Response> {
    let req = json_body(b)?;
    let lfs_from = state.config.hf_lfs_from;
    let files = req
        .get("files")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("the request lists no files (\"files\")"))?;
    let answer: Vec<Value> = files
        .iter()
        .map(|f| {
            let size = f.get("size").and_then(Value::as_u64).unwrap_or(0);
            let lfs = lfs_from.is_some_and(|from| size >= from);
            json!({
                "path": f.get("path").cloned().unwrap_or(Value::Null),
                "uploadMode": if lfs { "lfs" } else { "regular" },
                "shouldIgnore": false,
            })
        })
        .collect();
    Ok(Json(json!({ "files": answer })).into_response())
}

/// `POST /api/models/{repo}/commit/{rev}`: one mdl commit on branch `rev` (created from HEAD's
/// branch if missing) whose tree is the branch's with the request's files added or replaced
/// and its deletions made.
async fn commit(
    AxState(state): Shared,
    Access(served): Writer,
    Path((repo, rev)): Path<(String, String)>,
    query: axum::extract::Query<Vec<(String, String)>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    if query.0.iter().any(|(k, v)| k == "create_pr" && v != "0") {
        return Err(ApiError::new(
            ErrorCode::Unsupported,
            "mdl has no pull requests: commit to a branch (revision=...) instead",
        ));
    }
    let author = state.config.tokens.holder(&headers);
    let origin = crate::web::origin(&headers);
    let upload = spool(&served, &headers, body, state.config.max_body).await?;
    let warm = state.warm.clone();
    let deferred = served.clone();
    let answer = blocking(move || {
        // The tree is written as the request is read.
        let tree = served.repo.incoming_dir(".hf-commit-")?;
        let max_files = MaxFiles::of(&served.repo)?;
        let changes = read_changes(upload.path(), tree.path(), &max_files)?;
        drop(upload);
        if changes.is_empty() {
            return Err(bad("the commit changes nothing"));
        }
        let branch = mdl::RefName::new(&rev).map_err(|e| bad(e.to_string()))?;
        let message = match changes.description.trim() {
            "" => changes.summary.clone(),
            d => format!("{}\n\n{d}", changes.summary),
        };
        let mut staged = Vec::new();
        for (path, oid) in &changes.lfs {
            let from = crate::hf_lfs::staged_path(&served, oid)?;
            if !from.exists() {
                return Err(bad(format!("{path}: LFS object {oid} was not uploaded")));
            }
            staged.push((path.clone(), from));
        }
        link_staged(tree.path(), &staged)?;
        let (outcome, published) = served.change(true, |repo| {
            if let Some(parent) = &changes.parent {
                let tip = mdl::revision::resolve(repo, &rev)
                    .ok()
                    .map(|id| id.to_hex());
                // The client sends at most 40 hex digits: a prefix that long names the tip.
                let named = |tip: &String| parent.len() >= 40 && tip.starts_with(parent.as_str());
                if !tip.as_ref().is_some_and(named) {
                    return Err(ApiError::new(
                        ErrorCode::RefConflict,
                        format!("{rev} is no longer at {parent}: a commit has happened since"),
                    ));
                }
            }
            let opts = CommitOptions {
                message,
                branch: Some(branch),
                update: Some(changes.deleted),
                author,
                warm: Some(warm),
                ..Default::default()
            };
            Ok(mdl::commit::commit(
                repo,
                tree.path(),
                &opts,
                &mdl::NoProgress,
            )?)
        })?;
        drop(tree);
        crate::hf_lfs::unstage(staged.iter().map(|(_, s)| s.as_path()));
        let id = published.replayed.last().map_or(outcome.id, |(_, r)| *r);
        // The client reads the repository back from this URL: absolute for a two-part name,
        // relative for one (a one-part URL on the endpoint is one it refuses to parse).
        let origin = if repo.contains('/') {
            origin.as_str()
        } else {
            ""
        };
        Ok(Json(json!({
            "commitUrl": format!("{origin}{}/{repo}/commit/{id}", crate::hf::PREFIX),
            "commitOid": id.to_hex(),
            "pullRequestUrl": Value::Null,
        }))
        .into_response())
    })
    .await;
    if answer.is_ok() {
        deferred.work_deferred(Some(state.warm.clone()));
    }
    answer
}

/// The commit's LFS files placed in its tree under `root` (a fresh folder in the repository's
/// `incoming/` that this request owns, its paths checked as they were read): linked (else
/// copied) from where their upload left them.
#[allow(clippy::disallowed_methods)]
fn link_staged(root: &std::path::Path, staged: &[(String, std::path::PathBuf)]) -> ApiResult<()> {
    for (path, from) in staged {
        let to = root.join(path);
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| ApiError::internal(format!("making the folder of {path}: {e}")))?;
        }
        std::fs::hard_link(from, &to)
            .or_else(|_| std::fs::copy(from, &to).map(drop))
            .map_err(|e| ApiError::internal(format!("placing {path}: {e}")))?;
    }
    Ok(())
}

/// `POST /api/models/{repo}/branch/{branch}` `{"startingPoint"?}`: a new branch at that
/// revision (HEAD's commit by default).
async fn create_branch(
    Access(served): Writer,
    Path((_, branch)): Path<(String, String)>,
    b: Option<Json<Value>>,
) -> ApiResult<Response> {
    let start = b.and_then(|Json(v)| {
        v.get("startingPoint")
            .and_then(Value::as_str)
            .map(str::to_string)
    });
    blocking(move || {
        served.change(false, |repo| {
            let _writer = repo.writer();
            Ok(mdl::refs::create_branch(repo, &branch, start.as_deref())?)
        })?;
        Ok(Json(json!({})).into_response())
    })
    .await
}

/// `POST /api/models/{repo}/tag/{rev}` `{"tag", "message"?}`: a tag at `rev`, by the token's
/// holder.
async fn create_tag(
    AxState(state): Shared,
    Access(served): Writer,
    Path((_, rev)): Path<(String, String)>,
    headers: HeaderMap,
    b: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> ApiResult<Response> {
    let req = json_body(b)?;
    let tag = req
        .get("tag")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("the request names no tag (\"tag\")"))?
        .to_string();
    let tagger = state
        .config
        .tokens
        .holder(&headers)
        .unwrap_or_else(|| "mdl serve".into());
    let message = req
        .get("message")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .map(str::to_string);
    blocking(move || {
        served.change(false, |repo| {
            let _writer = repo.writer();
            Ok(mdl::refs::create_tag(
                repo,
                &tag,
                Some(&rev),
                message.as_deref(),
                &tagger,
            )?)
        })?;
        Ok(Json(json!({})).into_response())
    })
    .await
}
