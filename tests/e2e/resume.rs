//! Transfers that resume (issue 72): a clone or fetch whose pack stream is cut off keeps what
//! arrived whole, verified, and the same command again moves only the rest; nothing a ref
//! names changes until the whole transfer is in.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::peer_proxy::{Answer, Body, Proxy, Route};
use crate::server::*;
use crate::transfer::ok_with;
use crate::util::*;

/// Whether the proxy still cuts the next pack it passes.
static CUT_NEXT: AtomicBool = AtomicBool::new(true);

/// Passes everything, except the first pack stream, of which it sends the first half (as a
/// whole answer of that length: the stream ends there).
fn cut_once(route: Route, mut a: Answer) -> Answer {
    if route == Route::Pack && CUT_NEXT.swap(false, Ordering::SeqCst) {
        if let Body::Bytes(b) = &a.body {
            a.body = Body::Bytes(b[..b.len() / 2].to_vec());
        }
    }
    a
}

/// `mdl --json clone URL DIR`: the record bytes it moved.
fn cloned_bytes(url: &str, dir: &Path) -> u64 {
    let out = ok_with(READ, &["--json", "clone", url, dir.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["bytes"].as_u64().unwrap()
}

#[test]
fn a_clone_cut_off_half_way_moves_only_the_rest_the_next_time() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init", "repo"]);
    let repo = d.join("repo");
    // 48 tensors of 256 KiB of noise (nothing compresses), so a cut leaves many whole.
    let ts: Vec<T> = (0..48)
        .map(|i| tensor(&format!("layer{i}.w"), "F32", &[256, 256], 100 + i))
        .collect();
    let f = d.join("c.safetensors");
    let sent = write_safetensors(&f, &ts, &[]);
    ok(&repo, &["commit", f.to_str().unwrap(), "-m", "one"]);
    let server = Server::start(&["--root", d.to_str().unwrap()], d);
    let whole = cloned_bytes(&format!("{}/repo", server.base), &d.join("plain"));

    let proxy = Proxy::start(&server.base, cut_once);
    let url = format!("{}/repo", proxy.base);
    let target = d.join("c");
    let out = std::process::Command::new(mdl_bin())
        .args(["clone", &url, target.to_str().unwrap()])
        .env("MDL_TOKEN", READ)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a cut clone succeeded");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cut off"), "{stderr}");
    assert!(!target.exists(), "a cut clone left its target");

    // Again: the objects kept are not sent again.
    let rest = cloned_bytes(&url, &target);
    eprintln!("{stderr}the second clone moved {rest} of {whole} bytes");
    assert!(
        rest * 100 <= whole * 55,
        "the second clone moved {rest} of {whole} bytes"
    );
    assert!(
        rest * 100 >= whole * 40,
        "{rest} of {whole}: was half kept?"
    );
    let got = d.join("got.safetensors");
    ok(&target, &["checkout", "main", "-o", got.to_str().unwrap()]);
    assert_eq!(std::fs::read(&got).unwrap(), sent);
    assert_fsck_clean(&target);
    // Nothing of it was left beside the clone.
    let left: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("mdl-clone"))
        .collect();
    assert!(left.is_empty());
}
