//! The Hub's routes for a repository's refs and history, under `/hf` beside the read layout
//! (`hf.rs`): `list_repo_refs` (`GET /api/models/{repo}/refs`) and `list_repo_commits`
//! (`GET /api/models/{repo}/commits/{rev}`, in pages the client follows by their `Link`
//! header).

use axum::extract::{Path, Query};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use mdl_protocol::route::segment;
use serde_json::{json, Value};

use crate::access::{blocking, Access, ApiResult, Reader};

/// Commits in one page of `list_repo_commits`.
const PAGE: usize = 100;

/// The routes, nested under `/hf` with the others.
pub(crate) fn routes() -> Router<std::sync::Arc<crate::State>> {
    Router::new()
        .route("/api/models/{repo}/refs", get(refs))
        .route("/api/models/{repo}/commits/{rev}", get(commits))
}

/// `GET /api/models/{repo}/refs`: branches and tags with the commits they point at (mdl has
/// no converts and no pull requests: both lists are empty).
async fn refs(Access(served): Reader) -> ApiResult<Response> {
    let listed = blocking(move || Ok(mdl::refs::listed(&served.repo)?)).await?;
    let (mut branches, mut tags) = (Vec::new(), Vec::new());
    for r in &listed.refs {
        let entry =
            |name: &str| json!({ "name": name, "ref": r.name, "targetCommit": r.target.to_hex() });
        if let Some(name) = r.name.strip_prefix("refs/heads/") {
            branches.push(entry(name));
        } else if let Some(name) = r.name.strip_prefix("refs/tags/") {
            tags.push(entry(name));
        }
    }
    Ok(Json(json!({
        "branches": branches,
        "tags": tags,
        "converts": [],
        "pullRequests": [],
    }))
    .into_response())
}

#[derive(serde::Deserialize)]
struct PageQuery {
    #[serde(default)]
    p: usize,
}

/// `GET /api/models/{repo}/commits/{rev}?p=N`: page N of the history from `rev`, newest first,
/// with a `Link: <…>; rel="next"` header while more follow.
async fn commits(
    Access(served): Reader,
    Path((repo, rev)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let page = q.p;
    let wanted = page
        .saturating_add(1)
        .saturating_mul(PAGE)
        .saturating_add(1);
    let rev2 = rev.clone();
    let entries =
        blocking(move || Ok(mdl::log::log(&served.repo, Some(&rev2), Some(wanted))?)).await?;
    let more = entries.len() == wanted;
    let items: Vec<Value> = entries
        .into_iter()
        .skip(page * PAGE)
        .take(PAGE)
        .map(|e| {
            let (title, body) = e.message.split_once('\n').unwrap_or((&e.message, ""));
            json!({
                "id": e.id.to_hex(),
                "title": title,
                "message": body.trim(),
                "authors": [{ "user": e.author }],
                "date": e.time,
            })
        })
        .collect();
    let mut response = Json(items).into_response();
    if more {
        let next = format!(
            "<{}{}/api/models/{}/commits/{}?p={}>; rel=\"next\"",
            crate::web::origin(&headers),
            crate::hf::PREFIX,
            segment(&repo),
            segment(&rev),
            page + 1
        );
        if let Ok(v) = next.parse() {
            response.headers_mut().insert("link", v);
        }
    }
    Ok(response)
}
