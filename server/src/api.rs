//! Routes and handlers of the `/v1` API (`docs/HTTP_API.md`).

use mdl_protocol::{body, params, route, ErrorCode};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State as AxState};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use mdl::transfer::{self, RefUpdate};
use mdl::ObjectId;

use crate::access::{self, blocking, json_body, Access, ApiResult, Reader, Writer};
use crate::auth::{check, Scope};
use crate::error::ApiError;
use crate::upload::spool;
use crate::State;
use crate::{admin, budgeted, files, pack_upload, stream, tree};

type Shared = AxState<Arc<State>>;

/// Largest JSON request body. The largest real one is a list of 100,000 object ids (about
/// 6.7 MB), which is how many the client sends per request.
const MAX_JSON: usize = 8 << 20;

/// The router of the HTTP API over `state`.
pub fn app(state: Arc<State>) -> Router {
    let repo = Router::new()
        .route(route::REFS, get(refs).post(update_ref))
        .route(route::REFS_WAIT, get(wait_ref))
        .route(route::LOG, get(log))
        .route(route::COMMITS, post(commit))
        .route(route::COMMIT, get(show))
        .route(route::MANIFEST, get(manifest))
        .route(route::CHECKPOINT, get(files::checkpoint))
        .route(route::FILES, get(files::list))
        .route(route::FILE, get(files::file))
        .route(route::TENSOR, get(tensor))
        .route(route::OBJECTS, post(pack_upload::receive))
        .route(route::OBJECTS_UPLOAD, get(pack_upload::held))
        .route(route::OBJECTS_MISSING, post(missing))
        .route(route::OBJECTS_PLAN, post(plan))
        .route(route::OBJECTS_FETCH, post(fetch))
        .route(route::COMPACT, post(compact))
        .route(route::GC, post(gc))
        .route(route::STATS, get(admin::stats))
        .route(route::DIFF, get(admin::diff))
        .route(route::CONFIG, get(admin::config).post(admin::set_config))
        .route(route::BRANCHES, post(admin::branch))
        .route(route::BRANCH, delete(admin::delete_branch))
        .route(route::HEAD, post(admin::head))
        .route(route::TAGS, post(admin::tag))
        .route(route::TAG, delete(admin::delete_tag))
        .route(route::RESET, post(admin::reset))
        .route(route::REFLOG, get(admin::reflog))
        .route(route::FSCK, post(admin::fsck));
    let routes = Router::new()
        .route(route::REPOS, get(list_repos).post(create_repo))
        .nest(route::REPO, repo)
        .nest(
            crate::hf::PREFIX,
            crate::hf::routes(
                crate::hf_write::routes()
                    .merge(crate::hf_lfs::routes())
                    .merge(crate::hf_history::routes())
                    .merge(crate::hf_xet::routes()),
            ),
        )
        .merge(crate::web::routes())
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                ErrorCode::MethodNotAllowed,
                "this route does not take that method",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_JSON))
        // A request body that sends nothing for this long is cut off.
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
            state.config().limits.body_timeout,
        ))
        .with_state(state);
    // A two-part name written as two path segments is joined before routing (names.rs).
    Router::new().fallback_service(tower::ServiceExt::map_request(routes, join_names))
}

/// The request with a two-part repository name in its path joined into one segment.
fn join_names(mut request: axum::extract::Request) -> axum::extract::Request {
    if let Some(path) = crate::names::joined(request.uri().path()) {
        let whole = match request.uri().query() {
            Some(q) => format!("{path}?{q}"),
            None => path,
        };
        if let Ok(uri) = whole.parse() {
            *request.uri_mut() = uri;
        }
    }
    request
}

async fn list_repos(AxState(state): Shared, headers: HeaderMap) -> ApiResult<Response> {
    check(
        &state.config.tokens,
        state.config.read_public,
        &headers,
        Scope::Read,
    )?;
    let repos = state.names();
    Ok(Json(body::Repos { repos }).into_response())
}

/// Creates a repository in the served folder: an `admin` token's request. That a repository
/// exists is said to any reader (it is in `GET /v1/repos`), so a writer's "create unless it
/// exists" learns it and goes on.
async fn create_repo(
    AxState(state): Shared,
    headers: HeaderMap,
    b: Result<Json<body::NewRepo>, JsonRejection>,
) -> ApiResult<Response> {
    let tokens = &state.config.tokens;
    check(tokens, state.config.read_public, &headers, Scope::Read)?;
    let admin = check(tokens, false, &headers, Scope::Admin);
    let req = json_body(b)?;
    let made = req.clone();
    blocking(move || state.create_repo(&made.name, admin)).await?;
    Ok((StatusCode::CREATED, Json(req)).into_response())
}

async fn refs(Access(served): Reader) -> ApiResult<Response> {
    blocking(move || Ok(Json(mdl::refs::listed(&served.repo)?).into_response())).await
}

/// How often a long poll looks at the ref again: commits made by other processes (a trainer
/// committing into the served folder) move it without telling the server.
const WAIT_POLL: std::time::Duration = std::time::Duration::from_millis(10);

async fn wait_ref(
    Access(served): Reader,
    query: Result<Query<body::WaitQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let q = access::query(query)?;
    transfer::check_ref_name(&q.name)
        .map_err(|e| ApiError::new(ErrorCode::BadRequest, e.to_string()))?;
    let wait = q
        .timeout_ms
        .unwrap_or(body::MAX_WAIT_MS)
        .min(body::MAX_WAIT_MS);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(wait);
    loop {
        let (at, name) = (served.clone(), q.name.clone());
        let target =
            blocking(move || Ok(mdl::refs::get(&at.repo, &name)?.and_then(|v| v.target()))).await?;
        let moved = target != q.from;
        if moved || tokio::time::Instant::now() >= deadline {
            let name = q.name;
            return Ok(Json(body::Waited {
                name,
                target,
                moved,
            })
            .into_response());
        }
        tokio::time::sleep(WAIT_POLL).await;
    }
}

async fn log(
    Access(served): Reader,
    query: Result<Query<body::LogQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let q = access::query(query)?;
    if q.all && q.rev.is_some() {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            "all=true lists every branch's history; it takes no rev",
        ));
    }
    blocking(move || {
        let entries = match q.all {
            true => mdl::log::log_all(&served.repo, q.limit)?,
            false => mdl::log::log(&served.repo, q.rev.as_deref(), q.limit)?,
        };
        Ok(Json(entries).into_response())
    })
    .await
}

async fn show(
    Access(served): Reader,
    Path((_, rev)): Path<(String, String)>,
) -> ApiResult<Response> {
    let showing = {
        let served = served.clone();
        blocking(move || {
            let repo = &served.repo;
            Ok(budgeted::hold(repo, &rev, budgeted::SHOWN, |c| {
                mdl::show::showing(repo, &c.to_hex())
            })?)
        })
        .await?
    };
    // `mdl::show::Shown` as JSON, its tensors described and written one at a time as the
    // manifest is walked: the server holds the manifest and the rest of the answer, not the
    // list. The rest is written with an empty list, which is then filled in place.
    let body = stream::json("shown commit", move |w| {
        let head = serde_json::to_vec(&showing.head)?;
        // Strings are escaped in JSON, so the key's quotes can only be the key's.
        const EMPTY: &[u8] = b"\"tensors\":[]";
        let at = head
            .windows(EMPTY.len())
            .position(|x| x == EMPTY)
            .ok_or("a shown commit without its list of tensors")?
            + EMPTY.len()
            - 1;
        w.write_all(&head[..at])?;
        showing.tensors(&served.repo, 0..usize::MAX, stream::elements(w))?;
        Ok(w.write_all(&head[at..])?)
    });
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

fn parse_id(s: &str) -> ApiResult<ObjectId> {
    s.parse().map_err(|_| {
        ApiError::new(
            ErrorCode::InvalidId,
            format!("{s:?} is not a 64-digit object id"),
        )
    })
}

async fn manifest(
    Access(served): Reader,
    Path((_, id)): Path<(String, String)>,
) -> ApiResult<Response> {
    let id = parse_id(&id)?;
    let (bytes, budget) = {
        let served = served.clone();
        blocking(move || {
            let repo = &served.repo;
            let Some(len) = repo.manifest_object_len(&id)? else {
                return Err(ApiError::not_found(format!("no manifest {id}")));
            };
            let budget = budgeted::reserve_manifest(len, budgeted::MANIFEST_JSON)?;
            let bytes = repo.load_manifest_bytes(&id)?;
            // A damaged manifest is an error answer, not a body cut short.
            mdl::view_manifest(&id, &bytes)?;
            Ok((bytes, budget))
        })
        .await?
    };
    // The answer is written as the manifest is walked, its bytes and share of the decode
    // budget kept until the last piece is sent.
    let body = stream::json("manifest listing", move |w| {
        let _budget = budget;
        let m = mdl::view_manifest(&id, &bytes)?;
        Ok(serde_json::to_writer(
            w,
            &ManifestListing { id: &id, m: &m },
        )?)
    });
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// `GET /manifests/{id}`'s answer, written from the manifest as it is walked:
/// `{id, metadata, files, tensors}`.
struct ManifestListing<'m> {
    id: &'m ObjectId,
    m: &'m mdl_format::ManifestView<'m>,
}

impl serde::Serialize for ManifestListing<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let m = self.m;
        let files = || m.files().iter();
        let mut out = s.serialize_struct("ManifestListing", 4)?;
        out.serialize_field("id", self.id)?;
        out.serialize_field("metadata", &Seq(|| files().flat_map(|f| f.metadata())))?;
        let listed = || {
            files().map(|f| FileListing {
                path: f.path,
                format: f.format.name(),
                size: f.len(),
                metadata: Seq(|| f.metadata()),
            })
        };
        out.serialize_field("files", &Seq(listed))?;
        let tensors = || {
            m.tensors().map(|(f, e)| TensorListing {
                file: m.files()[f].path,
                name: e.name,
                dtype: e.dtype().name(),
                shape: e.shape(),
                id: e.id(),
                lossy: e.is_lossy(),
            })
        };
        out.serialize_field("tensors", &Seq(tensors))?;
        out.end()
    }
}

/// A JSON array of what an iterator yields, written as it is walked.
struct Seq<F>(F);

impl<F, I> serde::Serialize for Seq<F>
where
    F: Fn() -> I,
    I: Iterator,
    I::Item: serde::Serialize,
{
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq((self.0)())
    }
}

#[derive(serde::Serialize)]
struct FileListing<'m, M> {
    path: &'m str,
    format: &'static str,
    size: u64,
    metadata: M,
}

#[derive(serde::Serialize)]
struct TensorListing<'m> {
    file: &'m str,
    name: &'m str,
    dtype: &'static str,
    shape: Vec<u64>,
    id: ObjectId,
    lossy: bool,
}

async fn tensor(
    Access(served): Reader,
    Path((_, rev, tensor)): Path<(String, String, String)>,
    method: Method,
) -> ApiResult<Response> {
    if mdl_format::check_tensor_name(&tensor).is_err() {
        return Err(ApiError::new(
            ErrorCode::InvalidTensorName,
            format!("invalid tensor name {tensor:?}"),
        ));
    }
    let head = method == Method::HEAD;
    let (placed, commit) = {
        let served = served.clone();
        blocking(move || {
            let repo = &served.repo;
            let layout = budgeted::hold(repo, &rev, budgeted::LAYOUT, |c| {
                mdl::checkout::layout(repo, &c.to_hex())
            })?;
            let placed = layout
                .files
                .iter()
                .find_map(|f| f.tensor(&tensor))
                .ok_or_else(|| ApiError::not_found(format!("no tensor {tensor:?} in {rev}")))?
                .clone();
            Ok((placed, layout.commit))
        })
        .await?
    };
    let shape: Vec<String> = placed.header.shape.iter().map(u64::to_string).collect();
    let response = Response::builder()
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, placed.entry.content_len)
        .header(header::ETAG, format!("\"{}\"", placed.id))
        .header("x-mdl-dtype", placed.header.dtype.name())
        .header("x-mdl-shape", shape.join(","))
        .header("x-mdl-lossy", if placed.lossy { "true" } else { "false" })
        .header(route::HEADER_COMMIT, commit.to_hex())
        .header("x-mdl-object", placed.id.to_hex());
    response
        .body(if head {
            Body::empty()
        } else {
            stream::tensor(served, placed)
        })
        .map_err(|e| ApiError::internal(e.to_string()))
}

async fn commit(
    AxState(state): Shared,
    Access(served): Writer,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    body: Body,
) -> ApiResult<Response> {
    let params = access::query(query)?;
    let (path, params) = params::split_path(&params);
    let (files, params) = params::take(&params, params::FILES);
    let mut opts = mdl::commit::CommitOptions::from_params(
        params::decode(&params).map_err(|e| ApiError::new(e.code, e.message))?,
    );
    opts.warm = Some(state.warm.clone());
    let is_tree = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.split(';').next().is_some_and(|t| t.trim() == tree::TAR));
    // A tree upload: how many files its tar holds.
    let bad = |why: &str| Err(ApiError::new(ErrorCode::BadParameter, why));
    let tree_files =
        match (is_tree, files) {
            (true, _) if path.is_some() => return bad(
                "path names the one file of a file upload; a tree upload's paths are in the tar",
            ),
            (true, n) => match n.and_then(|n| n.parse::<usize>().ok()) {
                Some(n) => Some(n),
                None => return bad("a tree upload needs files=N, the number of files it holds"),
            },
            (false, Some(_)) => {
                return bad("files=N is for tree uploads (Content-Type: application/x-tar)")
            }
            (false, None) => None,
        };
    let path = path.unwrap_or_else(|| mdl::V1_FILE_PATH.to_string());
    let upload = spool(&served, &headers, body, state.config.max_body).await?;
    let (deferred, warm) = (served.clone(), state.warm.clone());
    let answer = blocking(move || {
        // A tree is unpacked beside the upload first; both are removed either way.
        let unpacked = match tree_files {
            Some(files) => {
                let dir = served.repo.incoming_dir(".tree-")?;
                tree::unpack(upload.path(), dir.path(), files)?;
                Some(dir)
            }
            None => None,
        };
        // The commit holds the repository's writer itself.
        let (mut outcome, published) = served.change(true, |repo| {
            Ok(match &unpacked {
                Some(dir) => mdl::commit::commit(repo, dir.path(), &opts, &mdl::NoProgress)?,
                None => mdl::commit::commit_file_as(
                    repo,
                    upload.path(),
                    &path,
                    &opts,
                    &mdl::NoProgress,
                )?,
            })
        })?;
        drop((upload, unpacked));
        if let Some((_, replayed)) = published.replayed.last() {
            outcome.id = *replayed;
        }
        Ok((StatusCode::CREATED, Json(outcome)).into_response())
    })
    .await;
    // What the commit left for later (`delta.defer`) is done after it is answered.
    if answer.is_ok() {
        deferred.work_deferred(Some(warm));
    }
    answer
}

/// The ids of a request, refused past [`body::MAX_IDS`].
fn bounded(ids: Vec<ObjectId>) -> ApiResult<Vec<ObjectId>> {
    if ids.len() > body::MAX_IDS {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            format!(
                "{} ids in one request; at most {} (send them in several)",
                ids.len(),
                body::MAX_IDS
            ),
        ));
    }
    Ok(ids)
}

async fn missing(
    Access(served): Reader,
    body: Result<Json<body::Ids>, JsonRejection>,
) -> ApiResult<Response> {
    let ids = bounded(json_body(body)?.ids)?;
    blocking(move || {
        let missing = transfer::missing(&served.repo, &ids)?;
        Ok(Json(body::Missing { missing }).into_response())
    })
    .await
}

async fn plan(
    Access(served): Reader,
    body: Result<Json<body::PlanRequest>, JsonRejection>,
) -> ApiResult<Response> {
    let req = json_body(body)?;
    if req.shallow.depth == Some(0) {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            "depth: 0 takes no commit; at least 1",
        ));
    }
    blocking(move || {
        for id in req.want.iter().chain(&req.shallow.since) {
            if !transfer::has_commit(&served.repo, id)? {
                return Err(ApiError::not_found(format!("no commit {id}")));
            }
        }
        let have: HashSet<ObjectId> = req.have.into_iter().collect();
        let has_commit = |id: &ObjectId| have.contains(id);
        let mut objects = transfer::plan(&served.repo, &req.want, &has_commit, &req.shallow)?;
        if req.deltas {
            transfer::derive_against(&served.repo, &req.want, &has_commit, &mut objects)?;
        }
        Ok(Json(body::Plan { objects }).into_response())
    })
    .await
}

async fn fetch(
    Access(served): Reader,
    body: Result<Json<body::FetchRequest>, JsonRejection>,
) -> ApiResult<Response> {
    let request = json_body(body)?;
    // A repeated id is sent once: the answer is bounded by MAX_IDS distinct records.
    let mut seen = HashSet::new();
    let mut ids = bounded(request.ids)?;
    ids.retain(|id| seen.insert(*id));
    // A pair names an id asked for, once; each is coded against its base as the pack is
    // written, or sent as stored.
    let mut against = HashMap::new();
    for pair in request.against {
        if !seen.contains(&pair.id) || against.insert(pair.id, pair.base).is_some() {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                format!("against: {} is not asked for once", pair.id),
            ));
        }
    }
    if let Some(r) = &request.resume {
        if !seen.contains(&r.id) || r.held >= r.len {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                format!("resume: {} is not asked for, or held whole", r.id),
            ));
        }
    }
    let ids = Arc::new(ids);
    {
        // Refuse unknown ids before the stream starts (a 200 cannot turn into a 404 later).
        let (served, ids) = (served.clone(), ids.clone());
        blocking(
            move || match transfer::unknown(&served.repo, &ids)?.first() {
                Some(id) => Err(ApiError::not_found(format!("no object {id}"))),
                None => Ok(()),
            },
        )
        .await?;
    }
    Ok((
        [(header::CONTENT_TYPE, route::PACK)],
        stream::pack(served, ids, against, request.resume),
    )
        .into_response())
}

async fn update_ref(
    Access(served): Writer,
    body: Result<Json<RefUpdate>, JsonRejection>,
) -> ApiResult<Response> {
    let update = json_body(body)?;
    blocking(move || {
        served.change(false, |repo| {
            let _writer = repo.writer();
            Ok(transfer::update_ref(repo, &update, "push")?)
        })?;
        let moved = body::RefMoved {
            name: update.name,
            new: update.new,
        };
        Ok(Json(moved).into_response())
    })
    .await
}

/// `POST /maintenance/compact`: `{max_depth?, dry_run?}`. Each chain is published under the
/// repository's writer on its own, so commits and ref updates go on between them. Over a
/// bucket it compacts the server's replica (ids do not change: nothing to publish).
async fn compact(
    Access(served): Writer,
    body: Result<Json<mdl::compact::CompactOptions>, JsonRejection>,
) -> ApiResult<Response> {
    let opts = json_body(body)?;
    blocking(move || {
        let outcome = mdl::compact::compact(&*served.writer()?, &opts, &mdl::NoProgress)?;
        Ok(Json(outcome).into_response())
    })
    .await
}

/// `POST /maintenance/gc`. The scan runs beside commits; the deletion takes the writer once.
/// Over a bucket, one step of the bucket's gc (mark, or sweep what an earlier gc marked).
async fn gc(
    Access(served): Writer,
    body: Result<Json<body::GcRequest>, JsonRejection>,
) -> ApiResult<Response> {
    let req = json_body(body)?;
    let opts = mdl::gc::GcOptions::parse(
        req.prune_older_than.as_deref(),
        req.expire_reflog.as_deref(),
        req.dry_run,
    )?;
    blocking(move || {
        if served.replica.is_some() {
            if req.expire_reflog.is_some() {
                return Err(ApiError::new(
                    ErrorCode::Unsupported,
                    "expire_reflog does not apply to a repository in object storage: it keeps no reflog",
                ));
            }
            let outcome = served.bucket_gc(opts.prune_older_than, opts.dry_run)?;
            return Ok(Json(body::GcAnswer::Bucket(outcome)).into_response());
        }
        let outcome = mdl::gc::gc(&*served.writer()?, &opts, &mdl::NoProgress)?;
        Ok(Json(body::GcAnswer::Disk(outcome)).into_response())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_worker_answers_without_its_message() {
        let e = blocking::<()>(|| panic!("secret /srv/path detail"))
            .await
            .unwrap_err();
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            !e.message.contains("secret") && !e.message.contains("/srv"),
            "{}",
            e.message
        );
    }
}
