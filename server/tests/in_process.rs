//! The HTTP API in process, through `app(state)` (no socket): every error answer's status is
//! its code's, auth scopes are enforced, Range requests return exactly the bytes asked for, and
//! a checkpoint download is byte-identical to a checkout. The same routes are tested over a real
//! socket in the end-to-end tests; these are the fast, exhaustive ones.

// Tests, examples and benchmarks write their own files (checkpoints, outputs, damage done on
// purpose); the rule that repository writes go through mdl-store is for the library crates.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use mdl::commit::{commit, CommitOptions};
use mdl::{NoProgress, Repository};
use mdl_protocol::{body, ErrorCode};
use mdl_server::{app, Config, Limits, Repos, State, Tokens};
use tower::ServiceExt;

const READ: &str = "read-token-0123456789";
const WRITE: &str = "write-token-0123456789";

/// A safetensors file of one f32 tensor of `n` values.
fn checkpoint(n: usize, seed: f32) -> Vec<u8> {
    let data: Vec<u8> = (0..n)
        .flat_map(|i| (i as f32 * 0.25 + seed).to_le_bytes())
        .collect();
    let mut header = format!(
        r#"{{"w":{{"dtype":"F32","shape":[{n}],"data_offsets":[0,{}]}}}}"#,
        data.len()
    );
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&data);
    file
}

struct Fixture {
    _dir: tempfile::TempDir,
    state: Arc<State>,
    file: Vec<u8>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let file = checkpoint(1000, 1.0);
    {
        let repo = Repository::init(&path).unwrap();
        let input = dir.path().join("c.safetensors");
        std::fs::write(&input, &file).unwrap();
        commit(&repo, &input, &CommitOptions::default(), &NoProgress).unwrap();
    }
    let tokens = Tokens::parse(&format!("r read {READ}\nw write {WRITE}\n")).unwrap();
    let config = Config {
        repos: Repos::One {
            name: "r".into(),
            path,
        },
        tokens,
        read_public: false,
        max_body: 1 << 20,
        hf_lfs_from: None,
        wait: std::time::Duration::from_secs(1),
        limits: Limits::default(),
    };
    let state = State::new(config, None).unwrap();
    Fixture {
        _dir: dir,
        state,
        file,
    }
}

struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    /// The error code of an error answer, checked against its status.
    fn code(&self) -> ErrorCode {
        let e: body::Error = serde_json::from_slice(&self.body).unwrap_or_else(|_| {
            panic!(
                "not an error body: {:?}",
                String::from_utf8_lossy(&self.body)
            )
        });
        assert_eq!(
            self.status.as_u16(),
            e.code.status(),
            "{} sent with {}",
            e.code,
            self.status
        );
        e.code
    }
}

async fn ask(
    f: &Fixture,
    method: Method,
    uri: &str,
    token: Option<&str>,
    extra: &[(&str, &str)],
) -> Answer {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    answer(f, req.body(Body::empty()).unwrap()).await
}

/// What the router answers to `req`.
async fn answer(f: &Fixture, req: Request<Body>) -> Answer {
    let resp = app(f.state.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap()
        .to_vec();
    Answer {
        status,
        headers,
        body,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn errors_carry_their_codes_status() {
    let f = fixture();
    let get = Method::GET;
    let cases: &[(Method, &str, Option<&str>, ErrorCode)] = &[
        (
            get.clone(),
            "/v1/repos/r/refs",
            None,
            ErrorCode::Unauthorized,
        ),
        (
            get.clone(),
            "/v1/repos/r/refs",
            Some("not-a-token-at-all"),
            ErrorCode::Unauthorized,
        ),
        (
            Method::POST,
            "/v1/repos/r/refs",
            Some(READ),
            ErrorCode::Forbidden,
        ),
        (
            get.clone(),
            "/v1/repos/nope/refs",
            Some(READ),
            ErrorCode::NoSuchRepository,
        ),
        (
            get.clone(),
            "/v1/repos/r/commits/nope",
            Some(READ),
            ErrorCode::UnknownRevision,
        ),
        (
            get.clone(),
            "/v1/repos/r/manifests/xyz",
            Some(READ),
            ErrorCode::InvalidId,
        ),
        (
            get.clone(),
            "/v1/repos/r/nothing-here",
            Some(READ),
            ErrorCode::NotFound,
        ),
        (
            Method::DELETE,
            "/v1/repos/r/refs",
            Some(WRITE),
            ErrorCode::MethodNotAllowed,
        ),
        (
            Method::POST,
            "/v1/repos/r/commits?colour=red",
            Some(WRITE),
            ErrorCode::BadParameter,
        ),
        (
            Method::POST,
            "/v1/repos/r/commits?branch=a..b",
            Some(WRITE),
            ErrorCode::InvalidName,
        ),
        (
            get.clone(),
            "/v1/repos/r/log?limit=many",
            Some(READ),
            ErrorCode::BadRequest,
        ),
        (
            Method::POST,
            "/v1/repos/r/objects/missing",
            Some(READ),
            ErrorCode::BadRequest,
        ),
    ];
    for (method, uri, token, want) in cases {
        let a = ask(&f, method.clone(), uri, *token, &[]).await;
        assert_eq!(a.code(), *want, "{method} {uri}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn scopes_and_listings() {
    let f = fixture();
    let a = ask(&f, Method::GET, "/v1/repos/r/refs", Some(READ), &[]).await;
    assert_eq!(a.status, StatusCode::OK);
    let refs: body::Refs = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(refs.head.as_deref(), Some("main"));
    assert!(refs.get("refs/heads/main").is_some());
    // A write token reads too.
    let a = ask(&f, Method::GET, "/v1/repos", Some(WRITE), &[]).await;
    let repos: body::Repos = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(repos.repos, vec!["r".to_string()]);
}

#[tokio::test(flavor = "multi_thread")]
async fn checkpoints_and_ranges_are_exact() {
    let f = fixture();
    let uri = "/v1/repos/r/checkpoints/main.safetensors";
    let whole = ask(&f, Method::GET, uri, Some(READ), &[]).await;
    assert_eq!(whole.status, StatusCode::OK);
    assert!(
        whole.body == f.file,
        "the download differs from the committed file"
    );
    assert!(whole
        .headers
        .contains_key(mdl_protocol::route::HEADER_COMMIT));

    let len = f.file.len();
    for (range, start, end) in [
        ("bytes=0-9", 0, 10),
        ("bytes=100-", 100, len),
        ("bytes=-16", len - 16, len),
        (&*format!("bytes=5-{}", len + 100), 5, len),
    ] {
        let a = ask(&f, Method::GET, uri, Some(READ), &[("range", range)]).await;
        assert_eq!(a.status, StatusCode::PARTIAL_CONTENT, "{range}");
        assert!(a.body == f.file[start..end], "{range}: wrong bytes");
        let content_range = format!("bytes {start}-{}/{len}", end - 1);
        assert_eq!(
            a.headers[header::CONTENT_RANGE],
            content_range.as_str(),
            "{range}"
        );
    }
    let a = ask(
        &f,
        Method::GET,
        uri,
        Some(READ),
        &[("range", &format!("bytes={len}-"))],
    )
    .await;
    assert_eq!(a.code(), ErrorCode::InvalidRange);
    assert_eq!(
        a.headers[header::CONTENT_RANGE],
        format!("bytes */{len}").as_str()
    );

    // The tensor route serves the tensor's own bytes.
    let a = ask(
        &f,
        Method::GET,
        "/v1/repos/r/tensors/main/w",
        Some(READ),
        &[],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(
        a.body == f.file[f.file.len() - 4000..],
        "the tensor's bytes differ"
    );
}

/// `POST` of a JSON body.
async fn post_json(f: &Fixture, uri: &str, token: &str, json: &serde_json::Value) -> Answer {
    let req = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(json).unwrap()))
        .unwrap();
    answer(f, req).await
}

/// A small request may not ask for a huge answer: a repeated id is sent once, and a request
/// naming more ids than a client ever sends is refused before anything is read.
#[tokio::test(flavor = "multi_thread")]
async fn object_requests_are_bounded() {
    let f = fixture();
    let a = ask(&f, Method::GET, "/v1/repos/r/refs", Some(READ), &[]).await;
    let refs: body::Refs = serde_json::from_slice(&a.body).unwrap();
    let head = refs.get("refs/heads/main").unwrap().to_string();
    let fetch = "/v1/repos/r/objects/fetch";
    let once = post_json(&f, fetch, READ, &serde_json::json!({ "ids": [head] })).await;
    assert_eq!(once.status, StatusCode::OK);
    let many = vec![head.clone(); 2000];
    let repeated = post_json(&f, fetch, READ, &serde_json::json!({ "ids": many })).await;
    assert_eq!(repeated.status, StatusCode::OK);
    assert_eq!(repeated.body, once.body, "a repeated id is sent once");
    let too_many: Vec<String> = (0..=body::MAX_IDS).map(|i| format!("{i:064x}")).collect();
    for route in [fetch, "/v1/repos/r/objects/missing"] {
        let a = post_json(&f, route, READ, &serde_json::json!({ "ids": too_many })).await;
        assert_eq!(a.code(), ErrorCode::BadRequest, "{route}");
        assert!(String::from_utf8_lossy(&a.body).contains("at most 100000"));
    }
}

/// Every answer of the web view — pages, the stylesheet, redirects, error pages — forbids
/// framing and sniffing and carries the content security policy (no script at all).
#[tokio::test(flavor = "multi_thread")]
async fn web_pages_carry_the_security_headers() {
    let f = fixture();
    for (uri, token) in [
        ("/ui/.login", None),
        ("/ui/", None),
        ("/ui/", Some(READ)),
        ("/ui/r", Some(READ)),
        ("/ui/.style.css", None),
        ("/ui/no-such-repo", Some(READ)),
        ("/", None),
    ] {
        let a = ask(&f, Method::GET, uri, token, &[]).await;
        let h = |name| {
            a.headers
                .get(name)
                .map(|v: &axum::http::HeaderValue| v.to_str().unwrap().to_string())
                .unwrap_or_else(|| panic!("{uri} ({}): no {name}", a.status))
        };
        assert_eq!(h("x-frame-options"), "DENY", "{uri}");
        assert_eq!(h("x-content-type-options"), "nosniff", "{uri}");
        let csp = h("content-security-policy");
        assert!(
            csp.contains("default-src 'none'") && !csp.contains("script-src"),
            "{uri}: {csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"), "{uri}: {csp}");
    }
}

/// A sign-in form posted from another site's page is refused (login CSRF); from the server's
/// own page, or from a client that names no page, it signs in.
#[tokio::test(flavor = "multi_thread")]
async fn a_cross_site_sign_in_is_refused() {
    let f = fixture();
    let post = |origin: Option<&'static str>| {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri("/ui/.login")
            .header(header::HOST, "127.0.0.1:8080")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        if let Some(o) = origin {
            req = req.header(header::ORIGIN, o);
        }
        let req = req
            .body(Body::from(format!("token={READ}&next=%2Fui%2Fr")))
            .unwrap();
        answer(&f, req)
    };
    for (origin, want) in [
        (Some("https://evil.example"), StatusCode::FORBIDDEN),
        (Some("null"), StatusCode::FORBIDDEN),
        (Some("http://127.0.0.1:8080"), StatusCode::SEE_OTHER),
        (None, StatusCode::SEE_OTHER),
    ] {
        let a = post(origin).await;
        assert_eq!(a.status, want, "{origin:?}");
        assert_eq!(
            a.headers.contains_key(header::SET_COOKIE),
            want == StatusCode::SEE_OTHER,
            "{origin:?}"
        );
    }
}

/// A commit page lists how the commit was made (its properties: a merge's strategy, the
/// training code's git commit).
#[tokio::test(flavor = "multi_thread")]
async fn a_commit_page_shows_the_commits_properties() {
    let f = fixture();
    let id = {
        let (repo, dir) = fixture_repo(&f);
        let input = dir.join("d.safetensors");
        std::fs::write(&input, checkpoint(1000, 2.0)).unwrap();
        let opts = CommitOptions {
            properties: vec![
                ("source.git".into(), "0123abcd".repeat(5)),
                ("merge.strategy".into(), "ties".into()),
            ],
            ..Default::default()
        };
        commit(&repo, &input, &opts, &NoProgress).unwrap().id
    };
    let a = ask(
        &f,
        Method::GET,
        &format!("/ui/r/commit/{id}"),
        Some(READ),
        &[],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    let page = String::from_utf8(a.body).unwrap();
    for want in [
        "merge.strategy",
        "ties",
        "source.git",
        &"0123abcd".repeat(5),
    ] {
        assert!(page.contains(want), "the commit page lacks {want}");
    }
}

/// `f`'s repository, opened beside the server, and the folder it is in.
fn fixture_repo(f: &Fixture) -> (Repository, std::path::PathBuf) {
    let Repos::One { path, .. } = &f.state.config().repos else {
        unreachable!("one repository")
    };
    let repo = Repository::open(path, &mdl::OpenOptions::default()).unwrap();
    (repo, path.parent().unwrap().to_path_buf())
}

/// A Trainer-like checkpoint folder committed on `f`'s repository (HEAD's branch); its id.
fn commit_trainer_folder(f: &Fixture) -> String {
    let (repo, dir) = fixture_repo(f);
    let dir = dir.join("checkpoint-30");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("model.safetensors"), checkpoint(1000, 3.0)).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"model_type":"gpt2","n_layer":2}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("README.md"),
        "---\nlicense: mit\n---\n# A tiny model\n\nTrained *briefly*. <script>alert(1)</script>\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("trainer_state.json"),
        r#"{"global_step": 30, "log_history": [
            {"step": 10, "loss": 2.5, "learning_rate": 0.0001},
            {"step": 20, "loss": 2.25, "learning_rate": 0.00009},
            {"step": 30, "loss": 1.875, "learning_rate": 0.00008, "eval_loss": 2.0}]}"#,
    )
    .unwrap();
    commit(&repo, &dir, &CommitOptions::default(), &NoProgress)
        .unwrap()
        .id
        .to_hex()
}

/// A commit page: a download link for every file (which downloads the file), the model card
/// rendered with its HTML shown as text, `config.json`, and snippets naming this revision on
/// this server.
#[tokio::test(flavor = "multi_thread")]
async fn a_commit_page_has_downloads_the_model_card_the_config_and_snippets() {
    let f = fixture();
    let id = commit_trainer_folder(&f);
    let a = ask(
        &f,
        Method::GET,
        &format!("/ui/r/commit/{id}"),
        Some(READ),
        &[("host", "models.example:8080")],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    let page = String::from_utf8(a.body).unwrap();
    for want in [
        &format!(r#"href="/ui/r/file/{id}/config.json""#),
        &format!(r#"href="/ui/r/file/{id}/README.md""#),
        "<h1>A tiny model</h1>",
        "<em>briefly</em>",
        "&lt;script&gt;alert(1)&lt;/script&gt;",
        "license: mit",
        "&#34;model_type&#34;: &#34;gpt2&#34;",
        &format!("AutoModel.from_pretrained(&#34;r&#34;, revision=&#34;{id}&#34;)"),
        "http://models.example:8080/hf",
        &format!("mdl -C http://models.example:8080/r checkout {id}"),
    ] {
        assert!(page.contains(want), "the commit page lacks {want}");
    }
    assert!(!page.contains("<script>"));

    let file = ask(
        &f,
        Method::GET,
        &format!("/ui/r/file/{id}/config.json"),
        Some(READ),
        &[],
    )
    .await;
    assert_eq!(file.status, StatusCode::OK);
    assert_eq!(file.body, br#"{"model_type":"gpt2","n_layer":2}"#);
    let disposition = file.headers[header::CONTENT_DISPOSITION].to_str().unwrap();
    assert_eq!(disposition, r#"attachment; filename="config.json""#);
    let none = ask(
        &f,
        Method::GET,
        &format!("/ui/r/file/{id}/nope.json"),
        Some(READ),
        &[],
    )
    .await;
    assert_eq!(none.status, StatusCode::NOT_FOUND);
    let anonymous = ask(
        &f,
        Method::GET,
        &format!("/ui/r/file/{id}/config.json"),
        None,
        &[],
    )
    .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
}

/// The repository page charts the Trainer's whole `log_history` of HEAD's newest checkpoint,
/// each point's value in its tooltip, and zooms to a range of steps.
#[tokio::test(flavor = "multi_thread")]
async fn the_repository_page_charts_the_training_curve_and_zooms() {
    let f = fixture();
    commit_trainer_folder(&f);
    let page = |uri: String| {
        let f = &f;
        async move {
            let a = ask(f, Method::GET, &uri, Some(READ), &[]).await;
            assert_eq!(a.status, StatusCode::OK, "{uri}");
            String::from_utf8(a.body).unwrap()
        }
    };
    let all = page("/ui/r".into()).await;
    assert!(all.contains(r#"id="curves""#) && all.contains("trainer_state.json of main"));
    for want in [
        "step 10: loss=2.5",
        "step 30: loss=1.875",
        "step 30: eval_loss=2",
    ] {
        assert!(all.contains(want), "the curve lacks {want}");
    }
    assert!(all.contains(r#"id="zoom""#));
    let zoomed = page("/ui/r?from=15&to=25".into()).await;
    assert!(zoomed.contains("step 20: loss=2.25"));
    assert!(!zoomed.contains("step 10: loss=2.5") && !zoomed.contains("step 30: loss=1.875"));
    assert!(zoomed.contains(r#"value="15""#) && zoomed.contains("all steps"));
    // Empty fields, as the form sends them, are open ends.
    let open = page("/ui/r?from=&to=20".into()).await;
    assert!(open.contains("step 10: loss=2.5") && !open.contains("step 30: loss=1.875"));
}
