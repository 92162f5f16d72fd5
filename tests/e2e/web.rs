//! The web view (`/ui`): its pages over HTTP, its sign-in, and (ignored in a plain `cargo
//! test`; scripts/test.sh runs it with Chromium installed) the pages in a real headless
//! Chromium, with screenshots.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::server::{bearer, http, Server, ADMIN, READ, WRITE};
use crate::util::*;

/// Tensors of a commit: two layers that drift by `seed`, an embedding, an optimizer moment,
/// and `extra` more small tensors.
fn checkpoint(dir: &Path, name: &str, seed: u64, extra: usize) -> PathBuf {
    let mut t = vec![
        tensor("model.layers.0.attn.weight", "F32", &[64, 32], seed),
        tensor("model.layers.1.mlp.weight", "F32", &[64, 32], seed + 1),
        tensor("model.embed.weight", "F32", &[32, 32], 7),
        tensor("state.0.exp_avg", "F32", &[64, 32], seed + 2),
    ];
    for i in 0..extra {
        t.push(tensor(
            &format!("extra.{i:03}.weight"),
            "F32",
            &[4],
            i as u64,
        ));
    }
    let path = dir.join(name);
    write_safetensors(&path, &t, &[]);
    path
}

/// A repository with history on two branches, metrics, a tag, a lossy commit, a commit of 130
/// tensors (two pages) and a message that is HTML.
fn web_repo(dir: &Path) -> (PathBuf, Vec<String>) {
    let repo = dir.join("run");
    ok(dir, &["init", "run"]);
    let mut ids = Vec::new();
    let mut commit = |file: PathBuf, args: &[&str]| {
        let mut a = vec!["commit", file.to_str().unwrap()];
        a.extend_from_slice(args);
        let out = json(&repo, &a);
        ids.push(out["id"].as_str().unwrap().to_string());
    };
    let f = |n, s, x| checkpoint(dir, n, s, x);
    commit(
        f("a.safetensors", 1, 0),
        &["-m", "first", "--step", "100", "--metric", "loss=3.5"],
    );
    commit(
        f("b.safetensors", 2, 0),
        &["-m", "second", "--step", "200", "--metric", "loss=2.5"],
    );
    commit(
        f("c.safetensors", 3, 0),
        &[
            "-m",
            "lossy third",
            "--step",
            "300",
            "--metric",
            "loss=2.0",
            "--lossy",
        ],
    );
    ok(&repo, &["tag", "v1", "HEAD~1"]);
    ok(&repo, &["branch", "exp", "HEAD~1"]);
    ok(&repo, &["switch", "exp"]);
    commit(
        f("d.safetensors", 4, 130),
        &[
            "-m",
            "<script>alert(1)</script> wide",
            "--step",
            "300",
            "--metric",
            "loss=2.2",
        ],
    );
    ok(&repo, &["switch", "main"]);
    (repo, ids)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

fn get(base: &str, path: &str, cookie: &str) -> (u16, String) {
    let (status, _, body) = http(base, "GET", path, &[("Cookie", cookie)], b"");
    (status, text(&body))
}

/// A one-time sign-in link (`/ui/.login?code=…`), asked for with the read token.
fn sign_in_link(base: &str) -> String {
    let (status, _, body) = http(
        base,
        "POST",
        "/ui/.code",
        &[("Authorization", &bearer(READ))],
        b"",
    );
    assert_eq!(status, 200, "{}", text(&body));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    v["path"].as_str().unwrap().to_string()
}

/// Signs in with `token` through the form; the session cookie (`mdl_session=…`).
fn sign_in(base: &str, token: &str) -> String {
    let form = format!("token={token}&next=%2Fui%2Frun");
    let (status, headers, _) = http(
        base,
        "POST",
        "/ui/.login",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        form.as_bytes(),
    );
    assert_eq!(status, 303);
    let location = &headers.iter().find(|(k, _)| k == "location").unwrap().1;
    assert_eq!(location, "/ui/run");
    let cookie = &headers.iter().find(|(k, _)| k == "set-cookie").unwrap().1;
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
    assert!(
        !cookie.contains(token),
        "the token itself must not be the cookie"
    );
    cookie.split(';').next().unwrap().to_string()
}

#[test]
fn pages_need_a_token_and_show_history_commits_comparisons_and_storage() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, ids) = web_repo(dir.path());
    let server = Server::start(&["-C", repo.to_str().unwrap()], dir.path());
    let base = &server.base;

    // Without a token: the sign-in page, for every page.
    for path in ["/ui/run", "/ui/run/commit/HEAD", "/ui/run/storage", "/ui/"] {
        let (status, body) = get(base, path, "");
        assert_eq!(status, 401, "{path}");
        assert!(body.contains(r#"id="login""#), "{path}: {body}");
    }
    let (status, body) = get(base, "/ui/run", "mdl_session=forged");
    assert_eq!((status, body.contains(r#"id="login""#)), (401, true));
    // A token is never taken in a URL, valid or not.
    for token in [READ, "not-a-token-at-all"] {
        let (status, body) = get(base, &format!("/ui/.login?token={token}"), "");
        assert_eq!(status, 400);
        assert!(body.contains("not taken in a link"), "{body}");
    }
    // A one-time sign-in link: made for a token, good once; a link elsewhere is not followed
    // after signing in.
    let (status, _, _) = http(base, "POST", "/ui/.code", &[], b"");
    assert_eq!(status, 401);
    let link = sign_in_link(base);
    let (status, headers, _) = http(
        base,
        "GET",
        &format!("{link}&next=https%3A%2F%2Fevil.example%2F"),
        &[],
        b"",
    );
    assert_eq!(status, 303);
    assert!(headers.contains(&("location".into(), "/ui/".into())));
    assert!(headers
        .iter()
        .any(|(k, v)| k == "set-cookie" && v.starts_with("mdl_session=")));
    let (status, body) = get(base, &link, "");
    assert_eq!(status, 401);
    assert!(body.contains("not valid"), "{body}");
    let (status, body) = get(base, "/ui/.login?code=made-up", "");
    assert_eq!((status, body.contains("not valid")), (401, true));

    // A read token is enough; write works too, and so does a bearer header.
    let cookie = sign_in(base, READ);
    sign_in(base, WRITE);
    // One token signing in again and again, or asking for codes, evicts only its own (any
    // read token could once sign every browser out): the others' sessions and links stay.
    let (status, _, body) = http(
        base,
        "POST",
        "/ui/.code",
        &[("Authorization", &bearer(WRITE))],
        b"",
    );
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let writers_link = v["path"].as_str().unwrap().to_string();
    let floods_first = sign_in(base, ADMIN);
    for _ in 0..150 {
        sign_in(base, ADMIN);
        let (status, _, _) = http(
            base,
            "POST",
            "/ui/.code",
            &[("Authorization", &bearer(ADMIN))],
            b"",
        );
        assert_eq!(status, 200);
    }
    assert_eq!(get(base, "/ui/run", &floods_first).0, 401);
    assert_eq!(get(base, "/ui/run", &cookie).0, 200);
    let (status, _, _) = http(base, "GET", &writers_link, &[], b"");
    assert_eq!(status, 303);
    let (status, _, _) = http(
        base,
        "GET",
        "/ui/run",
        &[("Authorization", &bearer(READ))],
        b"",
    );
    assert_eq!(status, 200);

    // The repository page: refs, every branch's commits, the chart with lossy commits ringed.
    let (status, page) = get(base, "/ui/run", &cookie);
    assert_eq!(status, 200);
    for id in &ids {
        assert!(page.contains(&id[..12]), "history lacks {id}");
    }
    for want in [
        r#"id="branches""#,
        ">exp<",
        ">main<",
        ">v1<",
        r#"data-metric="loss""#,
        r#"data-series="exp""#,
        r#"data-series="main""#,
        r#"class="lossy""#,
        "4 commits",
    ] {
        assert!(page.contains(want), "repository page lacks {want}");
    }
    // Text from commits is escaped.
    assert!(page.contains("alert(1)") && page.contains("wide"));
    assert!(!page.contains("<script>"));

    // A commit: its facts, files and tensors; the lossy one says so with its error.
    let (status, page) = get(base, &format!("/ui/run/commit/{}", ids[2]), &cookie);
    assert_eq!(status, 200);
    for want in [
        "lossy third",
        "c.safetensors",
        "model.layers.0.attn.weight",
        "[64, 32]",
        "F32",
        "lossy: relative error",
        "added to the store",
        "loss",
        &ids[1][..12],
    ] {
        assert!(page.contains(want), "commit page lacks {want}");
    }
    // 134 tensors: page 2 holds the last ones, not the first.
    let wide = format!("/ui/run/commit/{}", ids[3]);
    let (_, first) = get(base, &wide, &cookie);
    assert!(first.contains("page 1 of 2") && first.contains("model.layers.0.attn.weight"));
    let (_, second) = get(base, &format!("{wide}?page=2"), &cookie);
    assert!(second.contains("extra.129.weight") && !second.contains("model.layers.0.attn"));

    // Compare: ranked by relative change, grouped by layer, added tensors listed.
    let (status, page) = get(base, "/ui/run/compare?a=v1&b=exp", &cookie);
    assert_eq!(status, 200);
    for want in [
        r#"id="layers""#,
        r#"id="ranked""#,
        "model.layers.1",
        "extra.000.weight",
        r#"id="added""#,
        "130 added",
        r#"class="bar""#,
    ] {
        assert!(page.contains(want), "compare page lacks {want}");
    }
    // The unchanged embedding is not ranked among the changes.
    let ranked = &page[page.find(r#"id="ranked""#).unwrap()..];
    assert!(!ranked[..ranked.find("</table>").unwrap()].contains("model.embed.weight"));

    // Storage: the chart, roles (the moment is optimizer state), chains, what gc would free.
    let (status, page) = get(base, "/ui/run/storage", &cookie);
    assert_eq!(status, 200);
    for want in [
        r#"id="size-chart""#,
        "optimizer state",
        r#"id="depths""#,
        "would free",
    ] {
        assert!(page.contains(want), "storage page lacks {want}");
    }
    let roles = &page[page.find(r#"id="roles""#).unwrap()..];
    let optimizer = &roles[roles.find("optimizer state").unwrap()..];
    let size = &optimizer[optimizer.find(r#"class="num">"#).unwrap() + 13..];
    assert!(
        !size.starts_with("0 B"),
        "optimizer state counted as nothing"
    );

    // Errors are pages too.
    let (status, page) = get(base, "/ui/run/commit/no-such-rev", &cookie);
    assert_eq!(status, 404);
    assert!(page.contains("no-such-rev"));
    let (status, _) = get(base, "/ui/elsewhere", &cookie);
    assert_eq!(status, 404);
    server.stop();
}

#[test]
fn a_public_server_shows_its_pages_without_signing_in() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, _) = web_repo(dir.path());
    let server = Server::start(&["-C", repo.to_str().unwrap(), "--read-public"], dir.path());
    // The index sends a browser to the one repository.
    let (status, headers, _) = http(&server.base, "GET", "/ui/", &[], b"");
    assert_eq!(status, 303);
    assert!(headers.contains(&("location".into(), "/ui/run".into())));
    let (status, page) = get(&server.base, "/ui/run/storage", "");
    assert_eq!(status, 200);
    assert!(page.contains("What each commit added"));

    // The server keeps the storage report between requests, but never past a change: a commit
    // (forwarded to the server from the repository's folder) is on the next page served.
    let file = checkpoint(dir.path(), "e.safetensors", 9, 0);
    let out = json(&repo, &["commit", file.to_str().unwrap(), "-m", "fifth"]);
    let id = out["id"].as_str().unwrap();
    let (status, after) = get(&server.base, "/ui/run/storage", "");
    assert_eq!(status, 200);
    assert!(!page.contains(&id[..12]));
    let table = &after[after.find(r#"id="added-by-commit""#).unwrap()..];
    assert!(
        table.contains(&format!("/ui/run/commit/{id}")),
        "the new commit is missing from the storage page"
    );
    let total = |p: &str| p[p.find(r#"id="total""#).unwrap()..][..80].to_string();
    assert_ne!(total(&page), total(&after), "the store's size did not move");
    server.stop();
}

/// Chromium's headless flags for this closed machine (no background connections).
fn chromium(bin: &str, profile: &Path) -> Command {
    let mut c = Command::new(bin);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--window-size=1400,1100",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}

#[test]
#[ignore = "needs Chromium: scripts/test.sh runs it with MDL_CHROMIUM from scripts/chromium-env.sh"]
fn in_chromium() {
    let bin = std::env::var("MDL_CHROMIUM")
        .expect("MDL_CHROMIUM names the chromium binary (scripts/chromium-env.sh installs it)");
    let dir = tempfile::tempdir().unwrap();
    let (repo, ids) = web_repo(dir.path());
    // A Trainer checkpoint folder on main (its model card, config and whole training curve),
    // and a merge of two branches.
    let folder = dir.path().join("checkpoint-400");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::rename(
        checkpoint(dir.path(), "e.safetensors", 5, 0),
        folder.join("model.safetensors"),
    )
    .unwrap();
    std::fs::write(
        folder.join("config.json"),
        r#"{"architectures":["GPT2LMHeadModel"],"model_type":"gpt2","n_embd":32,"n_layer":2}"#,
    )
    .unwrap();
    std::fs::write(
        folder.join("README.md"),
        "---\nlicense: apache-2.0\ntags: [mdl, tiny]\n---\n# run\n\nA tiny GPT-2 fine-tuned \
         for **400 steps**.\n\n| split | loss |\n|---|---:|\n| train | 1.92 |\n| eval | 2.05 |\n",
    )
    .unwrap();
    let history: Vec<String> = (1..=80)
        .map(|i| {
            let step = i * 5;
            let loss =
                2.0 + 2.5 * (-(step as f64) / 120.0).exp() + 0.05 * ((i * 7 % 11) as f64 / 11.0);
            let lr = 1e-4 * (1.0 - step as f64 / 400.0);
            format!(r#"{{"step": {step}, "loss": {loss:.4}, "learning_rate": {lr:e}}}"#)
        })
        .collect();
    std::fs::write(
        folder.join("trainer_state.json"),
        format!(
            r#"{{"global_step": 400, "log_history": [{}]}}"#,
            history.join(",")
        ),
    )
    .unwrap();
    let card = json(
        &repo,
        &[
            "commit",
            folder.to_str().unwrap(),
            "-m",
            "checkpoint-400",
            "--step",
            "400",
            "--metric",
            "loss=1.92",
        ],
    );
    let card = card["id"].as_str().unwrap().to_string();
    ok(&repo, &["merge", "v1", "exp", "--branch", "soup"]);
    let server = Server::start(&["-C", repo.to_str().unwrap()], dir.path());
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("web-screenshots");
    std::fs::create_dir_all(&shots).unwrap();

    // Each visit signs in the way a person following the link `mdl serve` prints does: a
    // one-time code in the sign-in URL, a redirect that sets the session cookie, then the page
    // with that cookie.
    let visit = |page: &str, shot: Option<&str>| -> String {
        let profile = tempfile::tempdir().unwrap();
        let url = format!(
            "{}{}&next={}",
            server.base,
            sign_in_link(&server.base),
            page.replace('%', "%25")
                .replace('/', "%2F")
                .replace('?', "%3F")
                .replace('&', "%26")
                .replace('=', "%3D")
        );
        let out = chromium(&bin, profile.path())
            .args(["--dump-dom", &url])
            .output()
            .expect("run chromium");
        assert!(out.status.success(), "chromium: {}", text(&out.stderr));
        if let Some(name) = shot {
            let path = shots.join(format!("{name}.png"));
            let _ = std::fs::remove_file(&path);
            // The profile holds the session now (the link's code is used up).
            let out = chromium(&bin, profile.path())
                .arg(format!("--screenshot={}", path.display()))
                .arg(format!("{}{page}", server.base))
                .output()
                .expect("run chromium");
            assert!(out.status.success(), "chromium: {}", text(&out.stderr));
            let png = std::fs::read(&path).expect("chromium wrote no screenshot");
            assert!(
                png.starts_with(b"\x89PNG") && png.len() > 10_000,
                "{name}: blank"
            );
            eprintln!("screenshot: {}", path.display());
        }
        text(&out.stdout)
    };

    // Without signing in, the browser is shown the sign-in form.
    let profile = tempfile::tempdir().unwrap();
    let out = chromium(&bin, profile.path())
        .args(["--dump-dom", &format!("{}/ui/run", server.base)])
        .output()
        .unwrap();
    let dom = text(&out.stdout);
    assert!(
        dom.contains(r#"<form method="post" action="/ui/.login" id="login">"#),
        "{dom}"
    );

    let dom = visit("/ui/run", Some("repository"));
    for want in [
        r#"id="history""#,
        r#"data-metric="loss""#,
        r#"class="lossy""#,
        &ids[3][..12],
        "&lt;script&gt;alert(1)&lt;/script&gt;",
    ] {
        assert!(
            dom.contains(want),
            "repository page in Chromium lacks {want}"
        );
    }
    // The browser ran no script from a commit message.
    assert!(!dom.contains("<script>alert(1)"));
    assert!(dom.contains(r#"id="curves""#) && dom.contains("step 400: loss="));
    let dom = visit("/ui/run?from=100&to=300", Some("repository-zoomed"));
    assert!(dom.contains("step 100: loss=") && !dom.contains("step 400: loss="));
    let dom = visit(&format!("/ui/run/commit/{}", ids[2]), Some("commit"));
    assert!(dom.contains(r#"id="tensors""#) && dom.contains("lossy: relative error"));
    let dom = visit(&format!("/ui/run/commit/{card}"), Some("commit-model-card"));
    for want in [
        r#"id="model-card""#,
        "<strong>400 steps</strong>",
        "<table>",
        r#"id="config""#,
        r#"id="snippets""#,
        &format!("/ui/run/file/{card}/config.json"),
    ] {
        assert!(
            dom.contains(want),
            "the model card's commit page lacks {want}"
        );
    }
    let dom = visit("/ui/run/commit/soup", Some("commit-merge"));
    assert!(dom.contains("merge.strategy") && dom.contains("linear"));
    let dom = visit("/ui/run/compare?a=v1&b=exp", Some("compare"));
    assert!(dom.contains(r#"id="ranked""#) && dom.contains("130 added"));
    let dom = visit("/ui/run/storage", Some("storage"));
    assert!(dom.contains(r#"id="size-chart""#) && dom.contains("optimizer state"));
    server.stop();
}
