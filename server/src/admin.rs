//! Inspecting and administering a served repository: totals, comparisons, settings, branches,
//! tags, HEAD, reset, reflogs and fsck — what `mdl stats`, `diff`, `config`, `branch`, `tag`,
//! `switch`, `reset`, `reflog` and `fsck` do, for clients over HTTP and for those commands run
//! in a served repository's folder, which are forwarded here like `log` and `commit`.

use mdl_protocol::body;

use axum::extract::rejection::{JsonRejection, QueryRejection};

use axum::extract::{Path, Query};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::access::{blocking, json_body, query, Access, ApiResult, Reader, Writer};

pub(crate) async fn stats(
    Access(served): Reader,
    q: Result<Query<body::StatsQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let q = query(q)?;
    blocking(move || Ok(Json(mdl::stats::stats(&served.repo, q.lossy)?).into_response())).await
}

pub(crate) async fn diff(
    Access(served): Reader,
    q: Result<Query<body::DiffQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let q = query(q)?;
    let (compared, files) = {
        let served = served.clone();
        blocking(move || {
            let repo = &served.repo;
            let a = mdl::revision::resolve(repo, &q.a)?;
            let b = mdl::revision::resolve(repo, &q.b)?;
            let compared = mdl::diff::compare(repo, &a, &b, mdl::diff::WALK_COST)?;
            let files = compared.files()?;
            Ok((compared, files))
        })
        .await?
    };
    // `{"files":[…],"tensors":[…]}` (`mdl::diff::Diff`), each tensor's line written as it is
    // found: the server holds the two manifests and an index, not the list.
    let body = crate::stream::json("comparison", move |w| {
        let mut compared = compared;
        w.write_all(b"{\"files\":")?;
        serde_json::to_writer(&mut *w, &files)?;
        w.write_all(b",\"tensors\":[")?;
        compared.tensors(&served.repo, crate::stream::elements(w))?;
        Ok(w.write_all(b"]}")?)
    });
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

pub(crate) async fn config(Access(served): Reader) -> ApiResult<Response> {
    blocking(move || Ok(Json(mdl::config::config(&served.repo)?).into_response())).await
}

pub(crate) async fn set_config(
    Access(served): Writer,
    b: Result<Json<body::ConfigSet>, JsonRejection>,
) -> ApiResult<Response> {
    let req = json_body(b)?;
    blocking(move || {
        served.change(false, |repo| {
            let _writer = repo.writer();
            Ok(mdl::config::set_config(repo, &req.key, &req.value)?)
        })?;
        Ok(Json(req).into_response())
    })
    .await
}

pub(crate) async fn branch(
    Access(served): Writer,
    b: Result<Json<body::BranchRequest>, JsonRejection>,
) -> ApiResult<Response> {
    let req = json_body(b)?;
    blocking(move || {
        let (moved, _) = served.change(false, |repo| {
            let _writer = repo.writer();
            Ok(if req.force {
                mdl::refs::force_branch(repo, &req.name, req.rev.as_deref())?
            } else {
                let to = mdl::refs::create_branch(repo, &req.name, req.rev.as_deref())?;
                mdl::refs::BranchMove {
                    branch: req.name.clone(),
                    from: None,
                    to,
                }
            })
        })?;
        Ok(Json(moved).into_response())
    })
    .await
}

pub(crate) async fn delete_branch(
    Access(served): Writer,
    Path((_, name)): Path<(String, String)>,
    q: Result<Query<body::DeleteBranch>, QueryRejection>,
) -> ApiResult<Response> {
    let force = query(q)?.force;
    blocking(move || {
        let (was, _) = served.change(false, |repo| {
            let _writer = repo.writer();
            Ok(mdl::refs::delete_branch(repo, &name, force)?)
        })?;
        Ok(Json(body::Deleted { name, was }).into_response())
    })
    .await
}

pub(crate) async fn head(
    Access(served): Writer,
    b: Result<Json<body::Head>, JsonRejection>,
) -> ApiResult<Response> {
    let req = json_body(b)?;
    blocking(move || {
        served.change(false, |repo| {
            let _writer = repo.writer();
            Ok(mdl::refs::switch(repo, &req.branch)?)
        })?;
        Ok(Json(req).into_response())
    })
    .await
}

pub(crate) async fn tag(
    Access(served): Writer,
    b: Result<Json<body::TagRequest>, JsonRejection>,
) -> ApiResult<Response> {
    let req = json_body(b)?;
    blocking(move || {
        let (target, _) = served.change(false, |repo| {
            let _writer = repo.writer();
            let (rev, message) = (req.rev.as_deref(), req.message.as_deref());
            Ok(mdl::refs::create_tag(
                repo,
                &req.name,
                rev,
                message,
                &req.tagger,
            )?)
        })?;
        Ok(Json(body::Tagged {
            name: req.name,
            target,
        })
        .into_response())
    })
    .await
}

pub(crate) async fn delete_tag(
    Access(served): Writer,
    Path((_, name)): Path<(String, String)>,
) -> ApiResult<Response> {
    blocking(move || {
        let (was, _) = served.change(false, |repo| {
            let _writer = repo.writer();
            Ok(mdl::refs::delete_tag(repo, &name)?)
        })?;
        Ok(Json(body::Deleted { name, was }).into_response())
    })
    .await
}

pub(crate) async fn reset(
    Access(served): Writer,
    b: Result<Json<body::ResetRequest>, JsonRejection>,
) -> ApiResult<Response> {
    let req = json_body(b)?;
    blocking(move || {
        let (moved, _) = served.change(false, |repo| {
            let _writer = repo.writer();
            Ok(mdl::refs::reset(repo, &req.rev)?)
        })?;
        Ok(Json(moved).into_response())
    })
    .await
}

pub(crate) async fn reflog(
    Access(served): Reader,
    q: Result<Query<body::ReflogQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let q = query(q)?;
    blocking(move || {
        let (name, entries) = mdl::refs::reflog(&served.repo, q.name.as_deref())?;
        Ok(Json(body::Reflog { name, entries }).into_response())
    })
    .await
}

/// Checks without repairing: a repair may rebuild the database, which needs the repository
/// closed (`mdl fsck --repair` with the server stopped). Write scope: it reads every record.
pub(crate) async fn fsck(Access(served): Writer) -> ApiResult<Response> {
    blocking(move || Ok(Json(mdl::fsck::fsck(&*served.checker()?, false)?).into_response())).await
}
