//! The web view, served by `mdl serve` under `/ui`: a repository's history, commits,
//! comparisons and storage as HTML pages with server-drawn SVG charts. No script, no build
//! step, nothing loaded from elsewhere: templates (`server/templates/`, rendered by askama)
//! and one stylesheet (`server/static/style.css`) compiled into the binary.
//!
//! Reading needs what the API's reads need: a public server, or a token of read scope, which a
//! browser presents once at `/ui/.login` for a session cookie ([`session`]). Paths under
//! `/ui/.` can never be a repository's (no repository name starts with a dot).

mod chart;
mod pages;
mod session;

use std::sync::Arc;

use askama::Template;
use axum::extract::{Form, FromRequestParts, Path, Query, State as AxState};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use mdl_protocol::ErrorCode;
use serde::Deserialize;

use crate::access::blocking;
use crate::auth::Scope;
use crate::error::ApiError;
use crate::{Served, State};

pub(crate) use pages::StorageCache;
pub(crate) use session::{Sessions, SERVER_OWNER};

type Shared = AxState<Arc<State>>;

const STYLE: &str = include_str!("../../static/style.css");

/// The web view's routes (absolute paths; merged into the server's router).
pub(crate) fn routes() -> Router<Arc<State>> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/") }))
        .route("/ui", get(index))
        .route("/ui/", get(index))
        .route("/ui/.style.css", get(style))
        .route("/ui/.login", get(login_form).post(login))
        .route("/ui/.code", post(sign_in_code))
        .route("/ui/{repo}", get(repo))
        .route("/ui/{repo}/commit/{rev}", get(commit))
        .route("/ui/{repo}/file/{rev}/{*path}", get(download))
        .route("/ui/{repo}/compare", get(compare))
        .route("/ui/{repo}/storage", get(storage))
        .layer(axum::middleware::map_response(page_headers))
}

/// What a page may load: its own stylesheet, inline `style` attributes (the charts' bars and
/// colour keys) and inline SVG; no script from anywhere, no frame around it, forms posted only
/// back here.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; \
    style-src-attr 'unsafe-inline'; img-src 'self' data:; form-action 'self'; \
    frame-ancestors 'none'; base-uri 'none'";

/// Every answer of the web view, error pages and redirects included, is never framed
/// (clickjacking), never content-sniffed, and under [`CONTENT_SECURITY_POLICY`].
async fn page_headers(mut resp: Response) -> Response {
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

fn render(page: &impl Template, status: StatusCode) -> Response {
    match page.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(e) => {
            tracing::error!("rendering a page: {e}");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the page failed to render",
            )
                .into_response()
        }
    }
}

fn error_page(e: ApiError) -> Response {
    let page = pages::ErrorPage {
        status: e.status.as_u16(),
        message: e.message,
    };
    render(&page, e.status)
}

/// A request that may read; any other is answered with the sign-in page, which sends the
/// browser back to where it was going.
struct Viewer;

impl FromRequestParts<Arc<State>> for Viewer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<State>) -> Result<Self, Response> {
        if session::may_read(state, &parts.headers) {
            return Ok(Viewer);
        }
        let next = parts
            .uri
            .path_and_query()
            .map_or("/ui/", |p| p.as_str())
            .to_string();
        let page = pages::LoginPage {
            next,
            problem: None,
        };
        Err(render(&page, StatusCode::UNAUTHORIZED))
    }
}

/// Runs `build` on the served repository `name` on a blocking thread and renders its page.
async fn page<P: Template + Send + 'static>(
    state: Arc<State>,
    name: String,
    build: impl FnOnce(&Served, &str) -> mdl::Result<P> + Send + 'static,
) -> Response {
    if !crate::valid_repo_name(&name) {
        return error_page(ApiError::not_found(format!("no repository {name:?}")));
    }
    let built = blocking(move || {
        let served = state.repo(&name)?;
        served.refresh()?;
        Ok(build(&served, &name)?)
    })
    .await;
    match built {
        Ok(p) => render(&p, StatusCode::OK),
        Err(e) => error_page(e),
    }
}

#[derive(Deserialize)]
struct Paged {
    page: Option<usize>,
}

/// The repository page's query: a page of history, and the step range its charts show
/// (empty fields, as a form sends them, are open ends).
#[derive(Deserialize)]
struct RepoQuery {
    page: Option<usize>,
    from: Option<String>,
    to: Option<String>,
}

async fn index(AxState(state): Shared, _: Viewer) -> Response {
    let names = state.names();
    if let [only] = &names[..] {
        return Redirect::to(&format!("/ui/{only}")).into_response();
    }
    render(&pages::IndexPage { repos: names }, StatusCode::OK)
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

#[derive(Deserialize)]
struct LoginQuery {
    next: Option<String>,
    code: Option<String>,
    token: Option<String>,
}

/// Where to go after signing in: a path of the web view, never another site.
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n) if n.starts_with("/ui") && !n.starts_with("//") && !n.contains('\\') => {
            n.to_string()
        }
        _ => "/ui/".to_string(),
    }
}

/// The sign-in form; with `?code=`, a one-time sign-in link (`mdl serve` prints one;
/// `POST /ui/.code` makes more) signs in at once. A token in the URL is refused: it would stay
/// in the browser's history and in logs.
async fn login_form(AxState(state): Shared, Query(q): Query<LoginQuery>) -> Response {
    let next = safe_next(q.next.as_deref());
    let (problem, status) = if q.token.is_some() {
        (
            "A token is not taken in a link (it would stay in history and logs): paste it here.",
            StatusCode::BAD_REQUEST,
        )
    } else if let Some(code) = q.code {
        if let Some(owner) = state.sessions.redeem(&code) {
            return start_session(&state, &owner, next);
        }
        (
            "That sign-in link is not valid: each works once, for ten minutes.",
            StatusCode::UNAUTHORIZED,
        )
    } else {
        return render(
            &pages::LoginPage {
                next,
                problem: None,
            },
            StatusCode::OK,
        );
    };
    let page = pages::LoginPage {
        next,
        problem: Some(problem.into()),
    };
    render(&page, status)
}

/// `POST /ui/.code` with a token (`Authorization: Bearer`, read scope): a one-time sign-in
/// link for a browser, `{"code", "path"}`.
async fn sign_in_code(AxState(state): Shared, headers: HeaderMap) -> Response {
    let config = &state.config;
    if let Err(e) = crate::auth::check(&config.tokens, false, &headers, Scope::Read) {
        return e.into_response();
    }
    let owner = config.tokens.holder(&headers).unwrap_or_default();
    match state.sessions.issue_code(&owner) {
        Ok(code) => axum::Json(serde_json::json!({
            "path": format!("/ui/.login?code={code}"),
            "code": code,
        }))
        .into_response(),
        Err(e) => ApiError::internal(e).into_response(),
    }
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
    next: Option<String>,
}

async fn login(
    AxState(state): Shared,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    if !same_origin(&headers) {
        return error_page(ApiError::new(
            ErrorCode::Forbidden,
            "a sign-in posted from another site's page is refused",
        ));
    }
    sign_in(&state, &form.token, form.next.as_deref())
}

/// Whether a form post comes from this server's own pages. A browser names the page a form was
/// on (`Origin`, else `Referer`); one naming another host is refused, so another site cannot
/// sign a visitor in under its own token (login CSRF). A client that names neither is no
/// browser following another site's form.
fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let Some(from) = text(header::ORIGIN).or_else(|| text(header::REFERER)) else {
        return true;
    };
    let after_scheme = from.split_once("://").map_or(from, |(_, rest)| rest);
    let from_host = after_scheme.split('/').next();
    text(header::HOST).is_some_and(|host| Some(host) == from_host)
}

/// Starts a session for a valid token and sends the browser on; asks again for any other.
fn sign_in(state: &State, token: &str, next: Option<&str>) -> Response {
    let next = safe_next(next);
    let Some(owner) = session::token_owner(state, token) else {
        let page = pages::LoginPage {
            next,
            problem: Some("That token is not valid for this server.".into()),
        };
        return render(&page, StatusCode::UNAUTHORIZED);
    };
    start_session(state, &owner, next)
}

/// Starts a session of `owner`'s and sends the browser on to `next` with its cookie.
fn start_session(state: &State, owner: &str, next: String) -> Response {
    match state.sessions.start(owner) {
        Ok(id) => (
            StatusCode::SEE_OTHER,
            [
                (header::SET_COOKIE, session::set_cookie(&id)),
                (header::LOCATION, next),
            ],
        )
            .into_response(),
        Err(e) => error_page(ApiError::internal(e)),
    }
}

async fn repo(
    AxState(state): Shared,
    _: Viewer,
    Path(name): Path<String>,
    Query(q): Query<RepoQuery>,
) -> Response {
    let n = q.page.unwrap_or(1);
    let step = |v: Option<String>| v.and_then(|v| v.trim().parse::<u64>().ok());
    let steps = pages::Steps {
        from: step(q.from),
        to: step(q.to),
    };
    page(state, name, move |s, name| {
        pages::repo_page(&s.repo, name, n, steps)
    })
    .await
}

async fn commit(
    AxState(state): Shared,
    _: Viewer,
    Path((name, rev)): Path<(String, String)>,
    Query(q): Query<Paged>,
    headers: HeaderMap,
) -> Response {
    let n = q.page.unwrap_or(1);
    let origin = origin(&headers);
    page(state, name, move |s, name| {
        pages::commit_page(&s.repo, name, &rev, n, &origin)
    })
    .await
}

/// `http://HOST:PORT` as the client reached this server (`https` where a proxy in front
/// says so): the pages' snippets, the LFS batch answer's addresses.
pub(crate) fn origin(headers: &HeaderMap) -> String {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let host = text("host").unwrap_or("localhost");
    let scheme = match text("x-forwarded-proto") {
        Some("https") => "https",
        _ => "http",
    };
    format!("{scheme}://{host}")
}

/// `GET /ui/{repo}/file/{rev}/{path}`: one file of a commit, as a download (`Range` honoured).
async fn download(
    AxState(state): Shared,
    _: Viewer,
    Path((name, rev, path)): Path<(String, String, String)>,
    method: axum::http::Method,
    headers: HeaderMap,
) -> Response {
    if !crate::valid_repo_name(&name) {
        return error_page(ApiError::not_found(format!("no repository {name:?}")));
    }
    let answer = async {
        let served = blocking(move || {
            let served = state.repo(&name)?;
            served.refresh()?;
            Ok(served)
        })
        .await?;
        let (_, file, etag) = crate::files::file_of(&served, &rev, &path).await?;
        let base: String = path
            .rsplit('/')
            .next()
            .unwrap_or("file")
            .chars()
            .map(|c| {
                if c.is_ascii_graphic() && c != '"' && c != '\\' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let extra = [(
            header::CONTENT_DISPOSITION,
            format!("attachment; filename=\"{base}\""),
        )];
        crate::files::serve_file(served, &method, &headers, file, etag, &extra)
    }
    .await;
    answer.unwrap_or_else(error_page)
}

#[derive(Deserialize)]
struct CompareQuery {
    a: Option<String>,
    b: Option<String>,
    page: Option<usize>,
}

async fn compare(
    AxState(state): Shared,
    _: Viewer,
    Path(name): Path<String>,
    Query(q): Query<CompareQuery>,
) -> Response {
    let a =
        q.a.filter(|s| !s.is_empty())
            .unwrap_or_else(|| "HEAD~1".into());
    let b =
        q.b.filter(|s| !s.is_empty())
            .unwrap_or_else(|| "HEAD".into());
    let n = q.page.unwrap_or(1);
    page(state, name, move |s, name| {
        pages::compare_page(&s.repo, name, &a, &b, n)
    })
    .await
}

async fn storage(
    AxState(state): Shared,
    _: Viewer,
    Path(name): Path<String>,
    Query(q): Query<Paged>,
) -> Response {
    let n = q.page.unwrap_or(1);
    page(state, name, move |s, name| {
        pages::storage_page(&s.repo, &s.storage, name, n)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_in_only_sends_browsers_within_the_web_view() {
        assert_eq!(safe_next(Some("/ui/run?page=2")), "/ui/run?page=2");
        assert_eq!(safe_next(Some("https://evil.example/")), "/ui/");
        assert_eq!(safe_next(Some("//evil.example/ui")), "/ui/");
        assert_eq!(safe_next(None), "/ui/");
    }
}
