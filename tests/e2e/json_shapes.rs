//! `--json` output is an interface: fields are only ever added, never renamed, removed or given
//! another type. Every command's output shape (each field's path and JSON type) is kept in
//! `json-shapes.txt`; this test runs every command that has `--json` and compares.
//!
//! A field that disappears or changes type fails the test: that breaks scripts reading it. A new
//! field fails it too until it is added to the snapshot (rerun with `MDL_UPDATE_SNAPSHOTS=1`),
//! so that every addition is seen in review.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::server::{Server, READ, WRITE};
use crate::util::*;

const SNAPSHOT: &str = "json-shapes.txt";

/// Each field of `v` as `path: type`, arrays' elements under `[]`.
fn shape(v: &Value, path: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(map) => {
            if map.is_empty() {
                out.insert(format!("{path}: object"));
            }
            for (k, v) in map {
                shape(v, &format!("{path}.{k}"), out);
            }
        }
        Value::Array(items) => {
            if items.is_empty() {
                out.insert(format!("{path}: array"));
            }
            for v in items {
                shape(v, &format!("{path}[]"), out);
            }
        }
        Value::String(_) => {
            out.insert(format!("{path}: string"));
        }
        Value::Number(_) => {
            out.insert(format!("{path}: number"));
        }
        Value::Bool(_) => {
            out.insert(format!("{path}: bool"));
        }
        Value::Null => {
            out.insert(format!("{path}: null"));
        }
    }
}

/// Runs `mdl --json args…` (with a token for remotes) and returns its output's parsed JSON.
fn run_json(dir: &Path, args: &[&str], token: Option<&str>) -> Value {
    let mut cmd = Command::new(mdl_bin());
    // Run where the test's own git work tree is (see `json_output_only_ever_gains_fields`), so
    // that what a commit records of its source is the same wherever the suite runs.
    cmd.current_dir(dir)
        .arg("-C")
        .arg(dir)
        .arg("--json")
        .args(args);
    cmd.env("MDL_AUTHOR", "tester");
    if let Some(t) = token {
        cmd.env("MDL_TOKEN", t);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "mdl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("mdl --json {args:?} printed no JSON ({e})"))
}

/// `mdl --json ARGS` that fails: its one JSON document, after checking the exit code.
fn failed_json(dir: &Path, args: &[&str], exit: i32) -> Value {
    let out = Command::new(mdl_bin())
        .current_dir(dir)
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(exit), "mdl {args:?}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("mdl --json {args:?} failed without JSON ({e})"))
}

#[test]
fn failures_print_one_json_document_with_a_stable_code() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    crate::util::ok(d, &["init"]);
    for (args, exit, code) in [
        (&["show", "nope"][..], 1, "unknown_revision"),
        (&["show", "HEAD"], 1, "unborn_branch"),
        (&["branch", "-d", "nope"], 1, "no_such_ref"),
        (&["config", "no.such.key", "1"], 1, "unknown_config"),
        (&["branch", "--bogus"], 2, "usage"),
        (&["gc", "--prune-older-than", "soon"], 1, "invalid_duration"),
    ] {
        let v = failed_json(d, args, exit);
        assert_eq!(v["error"]["code"], code, "mdl {args:?}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(!message.is_empty() && !message.contains('\n'), "{message}");
        // Every code is one the HTTP API documents.
        assert!(code.parse::<mdl_protocol::ErrorCode>().is_ok());
    }
    let v = failed_json(d, &["-C", "http://127.0.0.1:9/repo", "log"], 1);
    assert_eq!(v["error"]["code"], "unreachable", "{v}");
}

#[test]
fn json_output_only_ever_gains_fields() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let repo = d.join("repo");
    let mut shapes = BTreeSet::new();
    let mut record = |name: &str, v: Value| {
        let mut fields = BTreeSet::new();
        shape(&v, "", &mut fields);
        shapes.extend(fields.into_iter().map(|f| format!("{name}{f}")));
    };
    let s = |p: &Path| p.to_str().unwrap().to_string();
    // A git work tree with one commit around everything: commits record its commit
    // (`source.*`), and do so whether or not the suite itself runs in a git checkout.
    for args in [
        &["init", "-q"][..],
        &["commit", "-q", "--allow-empty", "-m", "code"],
    ] {
        let ok = Command::new("git")
            .arg("-C")
            .arg(d)
            .args(args)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    }

    std::fs::create_dir(&repo).unwrap();
    record("init", run_json(d, &["init", &s(&repo)], None));
    let files: Vec<_> = (0..3)
        .map(|n| {
            let f = d.join(format!("f{n}.safetensors"));
            // The last has no step anywhere: `step` is null in its log line and show.
            let meta: &[(&str, &str)] = if n == 2 { &[] } else { &[("step", "1")] };
            write_safetensors(&f, &mixed(n), meta);
            f
        })
        .collect();
    record("commit", run_json(&repo, &["commit", &s(&files[0])], None));
    record(
        "commit",
        run_json(
            &repo,
            &[
                "commit",
                &s(&files[1]),
                "--step",
                "2",
                "--metric",
                "loss=1.5",
                "-m",
                "second",
            ],
            None,
        ),
    );
    record(
        "commit --lossy",
        run_json(&repo, &["commit", &s(&files[2]), "--lossy"], None),
    );
    let out = d.join("out.safetensors");
    record(
        "checkout",
        run_json(&repo, &["checkout", "main", "-o", &s(&out)], None),
    );
    record("log", run_json(&repo, &["log"], None));
    record("show", run_json(&repo, &["show", "main"], None));
    record("show", run_json(&repo, &["show", "main~1"], None));
    record("diff", run_json(&repo, &["diff", "main~2", "main"], None));
    record(
        "diff --changed",
        run_json(&repo, &["diff", "--changed", "main~2", "main"], None),
    );
    record(
        "branch NAME",
        run_json(&repo, &["branch", "exp", "main~1"], None),
    );
    record("branch", run_json(&repo, &["branch"], None));
    record("switch", run_json(&repo, &["switch", "exp"], None));
    record("reset REV", run_json(&repo, &["reset", "main"], None));
    record("switch", run_json(&repo, &["switch", "main"], None));
    record(
        "branch -f NAME REV",
        run_json(&repo, &["branch", "-f", "exp", "main~1"], None),
    );
    record("reflog [REF]", run_json(&repo, &["reflog", "exp"], None));
    record("status", run_json(&repo, &["status"], None));
    record(
        "tag NAME",
        run_json(&repo, &["tag", "v1", "main", "-m", "first"], None),
    );
    record("tag", run_json(&repo, &["tag"], None));
    ok(&repo, &["tag", "doomed", "main"]);
    record(
        "tag -d NAME",
        run_json(&repo, &["tag", "-d", "doomed"], None),
    );
    ok(&repo, &["branch", "merged", "main"]);
    record(
        "branch -d NAME",
        run_json(&repo, &["branch", "-d", "merged"], None),
    );
    record("error", failed_json(&repo, &["show", "no-such-rev"], 1));
    record(
        "config KEY VALUE",
        run_json(&repo, &["config", "delta.max_depth", "8"], None),
    );
    record("config", run_json(&repo, &["config"], None));
    record("fsck", run_json(&repo, &["fsck"], None));
    record(
        "compact",
        run_json(&repo, &["compact", "--max-depth", "1"], None),
    );
    record("maintenance", run_json(&repo, &["maintenance"], None));
    record(
        "gc",
        run_json(&repo, &["gc", "--prune-older-than", "0s"], None),
    );
    record("stats", run_json(&repo, &["stats"], None));
    record("stats", run_json(&repo, &["stats", "--lossy"], None));
    record(
        "merge",
        run_json(
            &repo,
            &[
                "merge", "main~2", "main~1", "--branch", "blend", "-m", "blended",
            ],
            None,
        ),
    );
    record(
        "merge",
        run_json(
            &repo,
            &[
                "merge",
                "main~1",
                "main",
                "--strategy",
                "task-arithmetic",
                "--base",
                "main~2",
                "--branch",
                "blend",
            ],
            None,
        ),
    );

    // serve prints its one document as a line once it listens, then keeps serving.
    let mut serve = Command::new(mdl_bin())
        .args(["--json", "serve", "--addr", "127.0.0.1:0", "-C"])
        .arg(&repo)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(serve.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let _ = serve.kill();
    let _ = serve.wait();
    record("serve", serde_json::from_str(&line).unwrap());

    let server = Server::start(&["--root", &s(d)], d);
    let url = format!("{}/repo", server.base);
    let clone = d.join("clone");
    record(
        "clone",
        run_json(d, &["clone", &url, &s(&clone)], Some(READ)),
    );
    record("remote", run_json(&clone, &["remote"], None));
    record(
        "remote add",
        run_json(&clone, &["remote", "add", "other", &url], None),
    );
    record(
        "remote set-url",
        run_json(&clone, &["remote", "set-url", "other", &url], None),
    );
    record(
        "remote set-token",
        run_json(&clone, &["remote", "set-token", "other"], Some(READ)),
    );
    record(
        "remote remove",
        run_json(&clone, &["remote", "remove", "other"], None),
    );
    record("fetch", run_json(&clone, &["fetch"], Some(READ)));
    record("pull", run_json(&clone, &["pull"], Some(READ)));
    ok(&clone, &["branch", "pushed"]);
    record(
        "push",
        run_json(&clone, &["push", "origin", "pushed"], Some(WRITE)),
    );
    server.stop();

    // Every operation has its shape recorded here (and so documented in docs/CLI_JSON.md).
    let recorded: BTreeSet<&str> = shapes
        .iter()
        .filter_map(|f| f.split([' ', '.', '[']).next())
        .collect();
    let unrecorded: Vec<String> = mdl_ops::Operation::ALL
        .iter()
        .map(|o| o.to_string())
        .filter(|o| !recorded.contains(o.split(' ').next().unwrap()))
        .collect();
    assert!(
        unrecorded.is_empty(),
        "no --json shape recorded for {unrecorded:?}"
    );

    let now: Vec<String> = shapes.into_iter().collect();
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/e2e")
        .join(SNAPSHOT);
    let header =
        "# The shape of every command's --json output (see json_shapes.rs). Fields may be\n\
                  # added (MDL_UPDATE_SNAPSHOTS=1 rewrites this file), never removed or retyped.\n";
    if std::env::var_os("MDL_UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, format!("{header}{}\n", now.join("\n"))).unwrap();
        return;
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let kept: BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    let now: BTreeSet<&str> = now.iter().map(String::as_str).collect();
    let gone: Vec<&&str> = kept.difference(&now).collect();
    assert!(
        gone.is_empty(),
        "--json fields removed or retyped (scripts read them; keep them):\n{gone:#?}"
    );
    let added: Vec<&&str> = now.difference(&kept).collect();
    assert!(
        added.is_empty(),
        "new --json fields: add them to tests/e2e/{SNAPSHOT} (MDL_UPDATE_SNAPSHOTS=1):\n{added:#?}"
    );
}

/// `docs/CLI_JSON.md` documents exactly the recorded shapes: a section a command, a row a
/// field and type.
#[test]
fn the_json_schema_page_documents_every_recorded_field() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/CLI_JSON.md")).unwrap();
    let mut documented = BTreeSet::new();
    let mut command = None;
    for line in doc.lines() {
        if let Some(c) = line.strip_prefix("## `").and_then(|l| l.strip_suffix('`')) {
            command = Some(c.to_string());
        } else if let (Some(c), Some(row)) = (&command, line.strip_prefix("| `")) {
            let (path, types) = row.split_once("` | ").expect("a field row");
            let path = match path {
                "(the document)" => "",
                p => p,
            };
            let sep = if path.starts_with('[') || path.is_empty() {
                ""
            } else {
                "."
            };
            for t in types.trim_end_matches(" |").split(" or ") {
                documented.insert(format!("{c}{sep}{path}: {t}"));
            }
        }
    }
    let snapshot = std::fs::read_to_string(root.join("tests/e2e").join(SNAPSHOT)).unwrap();
    let recorded: BTreeSet<String> = snapshot
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(str::to_string)
        .collect();
    let undocumented: Vec<_> = recorded.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&recorded).collect();
    assert!(
        undocumented.is_empty() && stale.is_empty(),
        "docs/CLI_JSON.md is out of step with {SNAPSHOT}:\nundocumented {undocumented:#?}\nnot recorded {stale:#?}"
    );
}
