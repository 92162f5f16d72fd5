//! Every bad input: a one-line error, a non-zero exit, and the repository exactly as it was.

use crate::util::*;

fn header_file(d: &std::path::Path, name: &str, header: &str, data_len: usize) -> String {
    let p = d.join(name);
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend(std::iter::repeat_n(0u8, data_len));
    std::fs::write(&p, b).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn bad_inputs_leave_repository_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);
    let good = d.join("good.safetensors");
    let bytes = write_safetensors(&good, &mixed(7), &[]);
    ok(d, &["commit", good.to_str().unwrap(), "-m", "good"]);
    ok(d, &["tag", "t1"]);
    let before = state(d);

    let truncated = d.join("trunc.safetensors");
    std::fs::write(&truncated, &bytes[..bytes.len() - 5]).unwrap();
    let tiny = d.join("tiny.safetensors");
    std::fs::write(&tiny, [1u8, 2, 3]).unwrap();
    let huge = d.join("huge.safetensors");
    std::fs::write(&huge, u64::MAX.to_le_bytes()).unwrap();
    // Files often mistaken for safetensors are named for what they are.
    let mistaken = |name: &str, bytes: &[u8]| {
        let p = d.join(name);
        std::fs::write(&p, bytes).unwrap();
        vec!["commit".to_string(), p.to_str().unwrap().to_string()]
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            mistaken("zip.safetensors", b"PK\x03\x04\x14\0\0\0archive"),
            "not a safetensors file: it is a zip archive",
        ),
        (
            mistaken("pickle.safetensors", b"\x80\x02}q\0."),
            "it is a Python pickle",
        ),
        (
            mistaken("config.safetensors", b"{\"hidden_size\": 768}"),
            "it is JSON text",
        ),
        (
            vec![
                "commit".into(),
                d.join("missing.safetensors").to_str().unwrap().into(),
            ],
            "cannot read",
        ),
        (
            vec!["commit".into(), truncated.to_str().unwrap().into()],
            "truncated",
        ),
        (
            vec!["commit".into(), tiny.to_str().unwrap().into()],
            "too short",
        ),
        (
            vec!["commit".into(), huge.to_str().unwrap().into()],
            "exceeds the limit",
        ),
        (
            vec![
                "commit".into(),
                header_file(d, "json.safetensors", "{not json", 0),
            ],
            "not valid JSON",
        ),
        (
            vec![
                "commit".into(),
                header_file(
                    d,
                    "ovl.safetensors",
                    r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
                    12,
                ),
            ],
            "overlap",
        ),
        (
            vec![
                "commit".into(),
                header_file(
                    d,
                    "dt.safetensors",
                    r#"{"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,2]}}"#,
                    2,
                ),
            ],
            "unknown dtype",
        ),
        (
            vec![
                "commit".into(),
                header_file(
                    d,
                    "dup.safetensors",
                    r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}"#,
                    4,
                ),
            ],
            "duplicate tensor name",
        ),
        (
            vec![
                "commit".into(),
                good.to_str().unwrap().into(),
                "--metric".into(),
                "loss".into(),
            ],
            "invalid metric",
        ),
        (
            vec![
                "commit".into(),
                good.to_str().unwrap().into(),
                "-b".into(),
                "bad..name".into(),
            ],
            "invalid name",
        ),
        (
            vec![
                "checkout".into(),
                "nope".into(),
                "-o".into(),
                d.join("o").to_str().unwrap().into(),
            ],
            "unknown revision",
        ),
        (
            vec![
                "checkout".into(),
                "main~5".into(),
                "-o".into(),
                d.join("o").to_str().unwrap().into(),
            ],
            "is the first commit (it has no parent)",
        ),
        (vec!["show".into(), "HEAD^2".into()], "it has no parent"),
        (vec!["show".into(), "0000".into()], "unknown revision"),
        (vec!["branch".into(), "a b".into()], "invalid name"),
        (
            vec!["branch".into(), "x".into(), "nope".into()],
            "unknown revision",
        ),
        (vec!["tag".into(), "t1".into()], "already exists"),
        (
            vec!["tag".into(), "-d".into(), "nope".into()],
            "no tag named",
        ),
        (vec!["switch".into(), "nope".into()], "no branch named"),
        (vec!["reset".into(), "nope".into()], "unknown revision"),
        (
            vec!["branch".into(), "-f".into(), "main".into(), "main~3".into()],
            "is the first commit",
        ),
        (
            vec!["diff".into(), "main".into(), "nope".into()],
            "unknown revision",
        ),
    ];
    for (args, want) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails(d, &args, want);
        assert_eq!(state(d), before, "mdl {args:?} changed the repository");
    }
    assert!(!d.join("o").exists());
    assert_fsck_clean(d);
    let fsck = json(d, &["fsck"]);
    assert_eq!(fsck["temp_files"].as_array().unwrap().len(), 0);
    assert_eq!(fsck["unindexed_records"], 0);
}

#[test]
fn ambiguous_prefix_and_not_a_repository() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fails(d, &["log"], "not an mdl repository");
    // A URL is never taken for a folder name: a scheme mdl does not speak is refused, and a
    // server's is asked (here there is none).
    let refused = "is not a place mdl keeps repositories";
    fails(d, &["init", "gs://bucket/run"], refused);
    for args in [
        ["-C", "gs://bucket/run", "init"],
        ["-C", "ftp://host/run", "log"],
    ] {
        let out = std::process::Command::new(mdl_bin())
            .current_dir(d)
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(refused),
            "{args:?}: {err}"
        );
    }
    fails(d, &["init", "http://127.0.0.1:9/run"], "127.0.0.1:9");
    let made: Vec<_> = std::fs::read_dir(d).unwrap().collect();
    assert!(made.is_empty(), "{made:?}");
    ok(d, &["init"]);
    fails(d, &["init"], "already exists");
    // Enough commits that some pair shares a first hex digit pair... use a 4-digit prefix search.
    let mut ids = Vec::new();
    for n in 0..40u64 {
        let p = d.join("c.safetensors");
        write_safetensors(&p, &[tensor("x", "U8", &[4], n)], &[]);
        ids.push(
            json(d, &["commit", p.to_str().unwrap()])["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    // Find two ids sharing their first 1 hex digit; a 4-digit prefix of one is unique, the
    // shared 1-digit prefix is too short to be accepted, so build the ambiguity from the
    // longest common prefix padded to 4 digits when available.
    let mut amb = None;
    for i in 0..ids.len() {
        for j in i + 1..ids.len() {
            let common = ids[i]
                .chars()
                .zip(ids[j].chars())
                .take_while(|(a, b)| a == b)
                .count();
            if common >= 4 {
                amb = Some(ids[i][..4].to_string());
            }
        }
    }
    for id in &ids {
        assert_eq!(json(d, &["show", &id[..12]])["id"], id.as_str());
    }
    if let Some(p) = amb {
        fails(d, &["show", &p], "ambiguous");
    }
    fails(
        d,
        &["show", "abc"],
        "an id prefix needs at least 4 hex digits",
    );
    fails(
        d,
        &["show", "HEAD^3"],
        "has no 3rd parent (it has 1 parent)",
    );
    fails(
        d,
        &["show", "HEAD~40"],
        "is the first commit (it has no parent)",
    );
}

#[test]
fn read_only_repository_refuses_writes_but_reads() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);
    let f = d.join("a.safetensors");
    write_safetensors(&f, &mixed(3), &[]);
    ok(d, &["commit", f.to_str().unwrap()]);
    let before = state(d);
    let mdl_dir = d.join(".mdl");
    let mut perm = std::fs::metadata(&mdl_dir).unwrap().permissions();
    perm.set_readonly(true);
    std::fs::set_permissions(&mdl_dir, perm.clone()).unwrap();
    fails(d, &["commit", f.to_str().unwrap()], "read-only");
    fails(d, &["tag", "x"], "read-only");
    assert_eq!(json(d, &["log"]).as_array().unwrap().len(), 1);
    assert_eq!(state(d), before);
    #[allow(clippy::permissions_set_readonly_false)]
    perm.set_readonly(false);
    std::fs::set_permissions(&mdl_dir, perm).unwrap();
    assert_fsck_clean(d);
}

#[test]
fn revisions_never_panic_and_terminal_output_is_inert() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);
    let f = d.join("a.safetensors");
    // A tensor name with escape sequences (safetensors allows any string) is refused at
    // commit, its name escaped in the message; metadata with them is kept, and shown inert.
    let mut ts = mixed(3);
    ts[0].name = "evil\u{1b}[2Jname".into();
    write_safetensors(&f, &ts, &[]);
    let err = fails(d, &["commit", f.to_str().unwrap()], "evil\\u{1b}[2Jname");
    assert!(!err.contains('\u{1b}'), "{err:?}");
    write_safetensors(&f, &mixed(3), &[("note", "\u{1b}]0;pwned\u{7}")]);
    let message = "clear\u{1b}[2J\rscreen\u{9b}31m";
    let out = std::process::Command::new(mdl_bin())
        .args([
            "-C",
            d.to_str().unwrap(),
            "commit",
            f.to_str().unwrap(),
            "-m",
            message,
        ])
        .env("MDL_AUTHOR", "eve\u{1b}[31m")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = state(d);
    for rev in [
        "main~é",
        "main^é",
        "main~1é",
        "é~",
        "main~99999999999999999999999",
        "~",
        "^",
    ] {
        let out = mdl(d, &["log", rev]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{rev:?}: {err}");
        assert!(!err.contains("panicked"), "{rev:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{rev:?}: {err}");
    }
    for args in [
        &["log"][..],
        &["show", "main"],
        &["diff", "main", "main"],
        &["tag"],
    ] {
        let shown = ok(d, args);
        assert!(
            !shown.chars().any(|c| c.is_control() && c != '\n'),
            "mdl {args:?} printed a control character: {shown:?}"
        );
    }
    let shown = ok(d, &["show", "main"]);
    assert!(
        shown.contains("clear\\x1b[2J\\x0dscreen\\u{9b}31m"),
        "{shown}"
    );
    assert!(shown.contains("eve\\x1b[31m"), "{shown}");
    // JSON keeps the exact text.
    assert_eq!(json(d, &["show", "main"])["message"], message);
    assert_eq!(state(d), before);
}

/// A safetensors file of `tensors` (name, data offsets) of U8, its header padded with spaces to
/// `header_len` bytes.
fn padded_header_file(path: &std::path::Path, header: &str, header_len: usize, data: usize) {
    let mut h = header.to_string();
    assert!(h.len() <= header_len);
    h.extend(std::iter::repeat_n(' ', header_len - h.len()));
    let mut b = (h.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(h.as_bytes());
    b.extend(std::iter::repeat_n(0u8, data));
    std::fs::write(path, b).unwrap();
}

/// A damaged file that says it is a checkpoint, a symlink out of the folder committed, names
/// with control characters or that no request could name, and commits over the repository's
/// limits: each refused in one line saying what is wrong, the repository as it was;
/// `--as-bytes` and `--follow-links` take what the user asks for (issue 47, items 1, 7–9).
#[test]
fn damaged_checkpoints_links_out_names_and_limits() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);
    let good = d.join("good.safetensors");
    write_safetensors(&good, &mixed(7), &[]);
    ok(d, &["commit", good.to_str().unwrap(), "-m", "good"]);
    let before = state(d);
    let s = |p: &std::path::Path| p.to_str().unwrap().to_string();

    // A torch.save archive cut short (no central directory), named as one or not: its first
    // entry says what it is.
    let pt = std::fs::read(crate::trees::torch_fixture("optimizer.pt")).unwrap();
    let cut = &pt[..pt.len() / 2];
    for name in ["optimizer.pt", "optimizer.data"] {
        let p = d.join(name);
        std::fs::write(&p, cut).unwrap();
        fails(
            d,
            &["commit", &s(&p)],
            "not a readable torch.save checkpoint",
        );
        assert_eq!(state(d), before);
    }
    // A .pt that is neither zip nor pickle.
    let json_pt = d.join("weights.pt");
    std::fs::write(&json_pt, b"{\"not\": \"weights\"}").unwrap();
    fails(d, &["commit", &s(&json_pt)], "it is JSON text");
    // Asked for, the damaged file is stored as bytes, with a note, and comes back whole.
    let cut_pt = d.join("optimizer.pt");
    ok(d, &["commit", &s(&cut_pt), "--as-bytes", "-m", "as bytes"]);
    let f = &json(d, &["show", "main"])["files"][0];
    assert_eq!(f["format"], "bytes");
    assert!(
        f["note"].as_str().unwrap().contains("stored as bytes"),
        "{f}"
    );
    let out = d.join("back.pt");
    ok(d, &["checkout", "main", "-o", &s(&out)]);
    assert_eq!(std::fs::read(&out).unwrap(), cut);
    ok(d, &["reset", "main~1"]);

    // Overlapping tensors whose header length reads as `{` are described as overlapping.
    let ovl = d.join("ovl.safetensors");
    let header = r#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}}"#;
    padded_header_file(&ovl, header, usize::from(b'{'), 12);
    let err = fails(d, &["commit", &s(&ovl)], "overlap");
    assert!(!err.contains("JSON"), "{err}");

    // A tensor name no request could name by itself is refused at commit.
    for name in ["../escape", "a\\u001bb"] {
        let p = d.join("named.safetensors");
        let header = format!(r#"{{"{name}":{{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}}}"#);
        let len = header.len().next_multiple_of(8);
        padded_header_file(&p, &header, len, 2);
        let err = fails(d, &["commit", &s(&p)], "tensor name");
        assert!(!err.contains('\u{1b}'), "{err:?}");
    }

    // A file name with a control character is shown escaped, never raw.
    let ctl = d.join("ctl");
    std::fs::create_dir(&ctl).unwrap();
    std::fs::write(ctl.join("a\u{1b}[31mb.bin"), b"x").unwrap();
    let err = fails(d, &["commit", &s(&ctl)], "control character");
    assert!(!err.contains('\u{1b}'), "{err:?}");
    std::fs::remove_dir_all(&ctl).unwrap();

    // A symlink out of the folder is refused, naming where it points, unless asked for.
    let secret = d.join("secret.txt");
    std::fs::write(&secret, b"password").unwrap();
    let ck = d.join("ck");
    std::fs::create_dir(&ck).unwrap();
    std::fs::copy(&good, ck.join("model.safetensors")).unwrap();
    std::os::unix::fs::symlink(&secret, ck.join("config.json")).unwrap();
    fails(
        d,
        &["commit", &s(&ck)],
        "secret.txt, outside the folder committed",
    );
    assert_eq!(state(d), before);
    ok(d, &["commit", &s(&ck), "--follow-links", "-m", "followed"]);
    let out = d.join("ck-out");
    ok(d, &["checkout", "main", "-o", &s(&out)]);
    assert_eq!(std::fs::read(out.join("config.json")).unwrap(), b"password");
    ok(d, &["reset", "main~1"]);
    let before = state(d);

    // Limits: tensors, files and header bytes of one commit, each configurable.
    fails(
        d,
        &["config", "limits.tensors", "0"],
        "a whole number, at least 1",
    );
    ok(d, &["config", "limits.tensors", "4"]);
    fails(
        d,
        &["commit", &s(&good)],
        "holds 8 tensors and byte objects, over the repository's limit of 4",
    );
    ok(d, &["config", "limits.tensors", "1000"]);
    ok(d, &["config", "limits.files", "1"]);
    fails(
        d,
        &["commit", &s(&ck), "--follow-links"],
        "holds 2 files, over the repository's limit of 1",
    );
    ok(d, &["config", "limits.files", "10"]);
    ok(d, &["config", "limits.header_bytes", "64"]);
    fails(
        d,
        &["commit", &s(&good)],
        "header bytes, over the repository's limit of 64",
    );
    let out = mdl(d, &["--json", "commit", &s(&good)]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["code"], "too_large", "{v}");
    assert_eq!(state(d), before);
    assert_fsck_clean(d);
}

/// A plain-HTTP object-storage endpoint without `AWS_ALLOW_HTTP=true`: one line naming the
/// variable (the client alone said "HTTP error: builder error"), and nothing made anywhere.
#[test]
fn a_plain_http_endpoint_names_the_variable_that_allows_it() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let run = |allow: Option<&str>, args: &[&str]| {
        let mut c = std::process::Command::new(mdl_bin());
        c.current_dir(dir.path())
            .args(args)
            .env("MDL_CACHE_DIR", &cache)
            .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
            .env("AWS_ACCESS_KEY_ID", "x")
            .env("AWS_SECRET_ACCESS_KEY", "y")
            .env_remove("AWS_ALLOW_HTTP");
        if let Some(v) = allow {
            c.env("AWS_ALLOW_HTTP", v);
        }
        c.output().unwrap()
    };
    for args in [
        &["init", "s3://bucket/p"][..],
        &["-C", "s3://bucket/p", "log"],
        &["clone", "s3://bucket/p", "here"],
    ] {
        for allow in [None, Some("false")] {
            let out = run(allow, args);
            assert!(!out.status.success(), "{args:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
            assert!(
                err.contains("http://127.0.0.1:9 is plain HTTP; set AWS_ALLOW_HTTP=true"),
                "{args:?}: {err}"
            );
        }
    }
    let made: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(made.is_empty(), "{made:?}");
    assert!(!cache.exists());
    // Allowed, but nothing listens there: one line saying the store did not answer, within
    // the retry deadline (20 s), not the client's bare "error sending request".
    let started = std::time::Instant::now();
    let out = run(Some("true"), &["-C", "s3://bucket/p", "log"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("the object store at http://127.0.0.1:9 did not answer (is it running"),
        "{err}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(40));
}
