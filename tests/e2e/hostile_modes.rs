//! The answer modes of the hostile peer (`peer_proxy`) that `hostile_peer` runs: what each
//! does to which answer, the commands it reaches, and what their error must say.

use serde_json::{json, Value};

use crate::peer_proxy::{self as proxy, Answer, Body, Route, Tamper};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cmd {
    Clone,
    Fetch,
    Pull,
    Checkout,
}

/// One way of answering, the commands it reaches, and what their error must say.
#[derive(Clone, Copy)]
pub(crate) struct Mode {
    pub name: &'static str,
    pub tamper: Tamper,
    pub cmds: &'static [Cmd],
    pub expect: &'static str,
}

const TRANSFERS: &[Cmd] = &[Cmd::Clone, Cmd::Fetch, Cmd::Pull];
const ALL: &[Cmd] = &[Cmd::Clone, Cmd::Fetch, Cmd::Pull, Cmd::Checkout];
const CHECKOUT: &[Cmd] = &[Cmd::Checkout];

fn edit_json(a: Answer, f: impl FnOnce(&mut Value)) -> Answer {
    if a.status != 200 {
        return a;
    }
    let mut v: Value = serde_json::from_slice(proxy::bytes(&a)).unwrap();
    f(&mut v);
    proxy::json(200, &v)
}

/// The JSON answer of route `want` as `f` edits it; every other answer as it is.
fn edit(route: Route, want: Route, a: Answer, f: impl FnOnce(&mut Value)) -> Answer {
    on(route, want, a, |a| edit_json(a, f))
}

fn add_ref(route: Route, a: Answer, name: &str) -> Answer {
    edit(route, Route::Refs, a, |v| {
        let target = v["refs"][0]["target"].clone();
        v["refs"]
            .as_array_mut()
            .unwrap()
            .push(json!({ "name": name, "target": target }));
    })
}

/// The successful answer of route `want` with the body `f` makes of its bytes; every other
/// answer as it is.
fn body_of(route: Route, want: Route, a: Answer, f: impl FnOnce(Vec<u8>) -> Body) -> Answer {
    if route != want || a.status != 200 {
        return a;
    }
    let bytes = proxy::bytes(&a).to_vec();
    Answer {
        status: 200,
        headers: a.headers,
        body: f(bytes),
    }
}

/// The answer of route `want` as `f` makes it; every other as it is.
fn on(route: Route, want: Route, a: Answer, f: impl FnOnce(Answer) -> Answer) -> Answer {
    if route == want {
        f(a)
    } else {
        a
    }
}

/// A JSON answer whose body goes out as `body` says.
fn json_body(body: Body) -> Answer {
    Answer {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        body,
    }
}

/// The first answer each command waits for (refs, or a checkout's listing) as `f` makes it;
/// every other as it is.
fn first(route: Route, a: Answer, f: impl FnOnce(Answer) -> Answer) -> Answer {
    match route {
        Route::Refs | Route::Listing => f(a),
        _ => a,
    }
}

/// Every planned object planned `size` bytes long, and the pack's first record sent as that
/// long: itself, then bytes without end.
fn inflated(route: Route, a: Answer, size: u64) -> Answer {
    if route == Route::Plan {
        return edit_json(a, |v| {
            for o in v["objects"].as_array_mut().unwrap() {
                o["size"] = size.into();
            }
        });
    }
    body_of(route, Route::Pack, a, |p| {
        let frames = proxy::frames(&p);
        let (id, _, body) = &frames[0];
        let mut first = b"MDLPACK1".to_vec();
        first.extend_from_slice(id);
        first.extend_from_slice(&size.to_le_bytes());
        first.extend_from_slice(body);
        Body::Endless(first, vec![0x5a; 4096])
    })
}

const FORGED: &str = "abababababababababababababababababababababababababababababababab";

pub(crate) fn modes() -> Vec<Mode> {
    vec![
        // A listing that names where to write.
        Mode {
            name: "listing_traversal",
            tamper: |r, a| {
                edit(r, Route::Listing, a, |v| {
                    v["files"][0]["path"] = "../../outside/sentinel.txt".into()
                })
            },
            cmds: CHECKOUT,
            expect: "'.' or '..' component",
        },
        Mode {
            name: "listing_absolute",
            tamper: |r, a| {
                edit(r, Route::Listing, a, |v| {
                    v["files"][0]["path"] = "/tmp/mdl-hostile-PWNED".into()
                })
            },
            cmds: CHECKOUT,
            expect: "absolute",
        },
        Mode {
            name: "listing_dotmdl",
            tamper: |r, a| {
                edit(r, Route::Listing, a, |v| {
                    v["files"][0]["path"] = ".mdl/meta.redb".into()
                })
            },
            cmds: CHECKOUT,
            expect: ".mdl",
        },
        Mode {
            name: "listing_control",
            tamper: |r, a| {
                edit(r, Route::Listing, a, |v| {
                    v["files"][0]["path"] = "a\u{1b}[2Jb\u{7}".into()
                })
            },
            cmds: CHECKOUT,
            expect: "control",
        },
        Mode {
            name: "listing_file_and_folder",
            tamper: |r, a| {
                edit(r, Route::Listing, a, |v| {
                    v["files"][0]["path"] = "a".into();
                    v["files"][1]["path"] = "a/b".into();
                })
            },
            cmds: CHECKOUT,
            expect: "both a file and a folder",
        },
        Mode {
            name: "listing_renamed",
            tamper: |r, a| {
                edit(r, Route::Listing, a, |v| {
                    v["files"][0]["path"] = "aaa-renamed.txt".into()
                })
            },
            cmds: CHECKOUT,
            expect: "not those commit",
        },
        Mode {
            name: "listing_size_lie",
            tamper: |r, a| {
                edit(r, Route::Listing, a, |v| {
                    let n = v["files"][0]["size"].as_u64().unwrap();
                    v["files"][0]["size"] = (n + 1).into();
                })
            },
            cmds: CHECKOUT,
            expect: "not those commit",
        },
        Mode {
            name: "listing_commit_lie",
            tamper: |r, a| edit(r, Route::Listing, a, |v| v["commit"] = FORGED.into()),
            cmds: CHECKOUT,
            expect: "no object",
        },
        // Downloads that are not the commit's bytes.
        Mode {
            name: "file_altered",
            tamper: |r, a| {
                body_of(r, Route::File, a, |mut b| {
                    let mid = b.len() / 2;
                    b[mid] ^= 0x40;
                    Body::Bytes(b)
                })
            },
            cmds: CHECKOUT,
            expect: "differ",
        },
        Mode {
            name: "file_endless",
            tamper: |r, a| body_of(r, Route::File, a, |b| Body::Endless(b, b"x".to_vec())),
            cmds: CHECKOUT,
            expect: "more than the",
        },
        Mode {
            name: "file_cut",
            tamper: |r, a| {
                body_of(r, Route::File, a, |b| {
                    Body::Bytes(b[..b.len() / 2].to_vec())
                })
            },
            cmds: CHECKOUT,
            expect: "announced",
        },
        Mode {
            name: "file_stalls",
            tamper: |r, a| {
                body_of(r, Route::File, a, |b| {
                    Body::Short(b.len() as u64, b[..b.len() / 2].to_vec())
                })
            },
            cmds: CHECKOUT,
            expect: "remote.idle-timeout",
        },
        // Names a fetch would create refs under.
        Mode {
            name: "tag_traversal",
            tamper: |r, a| add_ref(r, a, "refs/tags/../heads/main"),
            cmds: TRANSFERS,
            expect: "refs/tags/../heads/main",
        },
        Mode {
            name: "tag_dotmdl",
            tamper: |r, a| add_ref(r, a, "refs/tags/.mdl"),
            cmds: TRANSFERS,
            expect: "refs/tags/.mdl",
        },
        Mode {
            name: "tag_control",
            tamper: |r, a| add_ref(r, a, "refs/tags/a\u{1b}[2J\u{7}b"),
            cmds: TRANSFERS,
            expect: "\\u{1b}",
        },
        Mode {
            name: "tag_space",
            tamper: |r, a| add_ref(r, a, "refs/tags/x y"),
            cmds: TRANSFERS,
            expect: "refs/tags/x y",
        },
        Mode {
            name: "tag_empty",
            tamper: |r, a| add_ref(r, a, "refs/tags/"),
            cmds: TRANSFERS,
            expect: "empty",
        },
        Mode {
            name: "tag_nested_traversal",
            tamper: |r, a| add_ref(r, a, "refs/tags/a/../../heads/evil"),
            cmds: TRANSFERS,
            expect: "a/../../heads/evil",
        },
        Mode {
            name: "branch_control",
            tamper: |r, a| add_ref(r, a, "refs/heads/ma\u{7}in"),
            cmds: TRANSFERS,
            expect: "\\u{7}",
        },
        Mode {
            name: "head_hostile",
            tamper: |r, a| edit(r, Route::Refs, a, |v| v["head"] = "../x".into()),
            cmds: TRANSFERS,
            expect: "HEAD names",
        },
        Mode {
            name: "refs_twice",
            tamper: |r, a| {
                edit(r, Route::Refs, a, |v| {
                    let first = v["refs"][0].clone();
                    v["refs"].as_array_mut().unwrap().push(first);
                })
            },
            cmds: TRANSFERS,
            expect: "listed twice",
        },
        Mode {
            name: "tag_message_control",
            tamper: |r, a| {
                edit(r, Route::Refs, a, |v| {
                    let target = v["refs"][0]["target"].clone();
                    v["refs"].as_array_mut().unwrap().push(json!({
                        "name": "refs/tags/note", "target": target, "tagger": "x",
                        "time_ms": 1, "message": "hi\u{1b}]0;pwned\u{7}",
                    }));
                })
            },
            cmds: TRANSFERS,
            expect: "refs/tags/note",
        },
        // Refs to what is never sent.
        Mode {
            // (A pull takes one branch: another that names nothing is not its business.)
            name: "branch_to_missing_commit",
            tamper: |r, a| {
                edit(r, Route::Refs, a, |v| {
                    v["refs"]
                        .as_array_mut()
                        .unwrap()
                        .push(json!({ "name": "refs/heads/zz", "target": FORGED }));
                })
            },
            cmds: &[Cmd::Clone, Cmd::Fetch],
            expect: "abababab",
        },
        Mode {
            name: "plan_drops_the_commits",
            tamper: |r, a| {
                edit(r, Route::Plan, a, |v| {
                    let objects = v["objects"].as_array_mut().unwrap();
                    // Commits are planned last: leave them out.
                    let keep = objects.len().saturating_sub(2);
                    objects.truncate(keep);
                })
            },
            cmds: TRANSFERS,
            expect: "is not in the repository",
        },
        Mode {
            name: "plan_twice",
            tamper: |r, a| {
                edit(r, Route::Plan, a, |v| {
                    let first = v["objects"][0].clone();
                    v["objects"].as_array_mut().unwrap().push(first);
                })
            },
            cmds: TRANSFERS,
            expect: "twice",
        },
        Mode {
            name: "plan_huge",
            tamper: |r, a| {
                on(r, Route::Plan, a, |_| {
                    json_body(Body::Endless(
                        b"{\"objects\":[".to_vec(),
                        b"{\"id\":\"ab\",\"size\":1},".to_vec(),
                    ))
                })
            },
            cmds: TRANSFERS,
            expect: "over 268435456 bytes",
        },
        // Packs that hold what was not asked for, or more than was planned.
        Mode {
            name: "frame_oversized",
            tamper: |r, a| {
                body_of(r, Route::Pack, a, |p| {
                    let mut frames = proxy::frames(&p);
                    frames[0].1 = 1 << 40;
                    Body::Bytes(proxy::pack(&frames))
                })
            },
            cmds: TRANSFERS,
            expect: "1099511627776 bytes",
        },
        Mode {
            name: "plan_beyond_the_disk",
            tamper: |r, a| inflated(r, a, 1 << 50),
            cmds: TRANSFERS,
            expect: "the disk holding this one has",
        },
        Mode {
            // A record as long as planned, and planned long: it goes to disk as it arrives,
            // never into memory, and its checksum refuses it.
            name: "frame_streamed",
            tamper: |r, a| inflated(r, a, 256 << 20),
            cmds: TRANSFERS,
            expect: "record of",
        },
        Mode {
            name: "frame_not_asked_for",
            tamper: |r, a| {
                body_of(r, Route::Pack, a, |p| {
                    let mut frames = proxy::frames(&p);
                    frames[0].0 = [0xab; 32];
                    Body::Bytes(proxy::pack(&frames))
                })
            },
            cmds: TRANSFERS,
            expect: "not asked for",
        },
        Mode {
            name: "expired_frames_without_end",
            tamper: |r, a| {
                body_of(r, Route::Pack, a, |p| {
                    let frames = proxy::frames(&p);
                    let mut expired = frames[0].0.to_vec();
                    expired.extend_from_slice(&u64::MAX.to_le_bytes());
                    expired.push(1);
                    expired.extend_from_slice(&16u64.to_le_bytes());
                    expired.extend_from_slice(&0i64.to_le_bytes());
                    expired.extend_from_slice(&0u16.to_le_bytes());
                    Body::Endless(b"MDLPACK1".to_vec(), expired)
                })
            },
            cmds: TRANSFERS,
            expect: "sent before",
        },
        Mode {
            name: "pack_cut",
            tamper: |r, a| {
                body_of(r, Route::Pack, a, |p| {
                    Body::Bytes(p[..p.len() * 2 / 3].to_vec())
                })
            },
            cmds: TRANSFERS,
            expect: "cut off: pack stream ends early",
        },
        Mode {
            name: "pack_corrupt",
            tamper: |r, a| {
                body_of(r, Route::Pack, a, |p| {
                    let mut frames = proxy::frames(&p);
                    let last = frames
                        .iter()
                        .rposition(|f| f.1 != u64::MAX && f.2.len() > 200)
                        .unwrap();
                    let mid = frames[last].2.len() / 2;
                    frames[last].2[mid] ^= 1;
                    Body::Bytes(proxy::pack(&frames))
                })
            },
            cmds: TRANSFERS,
            expect: "checksum",
        },
        Mode {
            name: "pack_stalls",
            tamper: |r, a| {
                body_of(r, Route::Pack, a, |p| {
                    Body::Short(p.len() as u64, p[..p.len() / 2].to_vec())
                })
            },
            cmds: TRANSFERS,
            expect: "remote.idle-timeout",
        },
        // Documents over their limits.
        Mode {
            name: "refs_huge_declared",
            tamper: |r, a| {
                on(r, Route::Refs, a, |_| {
                    json_body(Body::Short(1000 << 20, b"{\"refs\":[".to_vec()))
                })
            },
            cmds: TRANSFERS,
            expect: "over the limit of 67108864",
        },
        Mode {
            name: "refs_huge_endless",
            tamper: |r, a| {
                on(r, Route::Refs, a, |_| {
                    json_body(Body::Endless(
                        b"{\"refs\":[".to_vec(),
                        b"{\"name\":\"refs/tags/x\"},".to_vec(),
                    ))
                })
            },
            cmds: TRANSFERS,
            expect: "over 67108864 bytes",
        },
        // Connections that misbehave, on the first answer each command waits for.
        Mode {
            name: "stalled",
            tamper: |r, a| {
                first(r, a, |a| Answer {
                    body: Body::Stall,
                    ..a
                })
            },
            cmds: ALL,
            expect: "remote.idle-timeout",
        },
        Mode {
            name: "dripping",
            tamper: |r, a| {
                first(r, a, |a| Answer {
                    body: Body::Drip(proxy::bytes(&a).to_vec()),
                    ..a
                })
            },
            cmds: ALL,
            expect: "remote.request-timeout",
        },
        Mode {
            name: "length_never_sent",
            tamper: |r, a| {
                first(r, a, |a| Answer {
                    body: Body::Short(10_000, b"{\"refs\": [], \"files\": [], \"commit".to_vec()),
                    ..a
                })
            },
            cmds: ALL,
            expect: "remote.idle-timeout",
        },
        Mode {
            name: "gzip",
            tamper: |r, a| {
                first(r, a, |mut a| {
                    a.headers.push(("content-encoding".into(), "gzip".into()));
                    a
                })
            },
            cmds: ALL,
            expect: "content encoded as \"gzip\"",
        },
        Mode {
            name: "error_without_end",
            tamper: |r, a| {
                first(r, a, |_| Answer {
                    status: 500,
                    headers: vec![],
                    body: Body::Endless(b"broken: ".to_vec(), b"x".to_vec()),
                })
            },
            cmds: ALL,
            expect: "HTTP 500",
        },
        Mode {
            name: "redirect_loop",
            tamper: |r, a| {
                first(r, a, |_| Answer {
                    status: 302,
                    headers: vec![("location".into(), "/v1/repos/srv/refs".into())],
                    body: Body::Bytes(Vec::new()),
                })
            },
            cmds: ALL,
            expect: "redirect",
        },
        Mode {
            name: "not_json",
            tamper: |r, a| {
                first(r, a, |_| Answer {
                    status: 200,
                    headers: vec![("content-type".into(), "text/html".into())],
                    body: Body::Bytes(b"<html>hello</html>".to_vec()),
                })
            },
            cmds: ALL,
            expect: "not the JSON expected",
        },
    ]
}
