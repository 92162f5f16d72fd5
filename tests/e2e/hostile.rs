//! The server against clients that mean harm or make mistakes: what an error tells them,
//! lengths that lie, slow and idle connections, many requests at once.

use crate::server::{bearer, http, Server, WRITE};
use crate::util::*;

#[test]
fn errors_name_no_server_paths() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let served = d.join("srv");
    ok(&served, &["init"]);
    let server = Server::start(&["-C", served.to_str().unwrap()], d);
    let auth = bearer(WRITE);
    let secret = d.to_str().unwrap();
    let bodies: [&[u8]; 3] = [
        b"not safetensors at all",
        &[8, 0, 0, 0, 0, 0, 0, 0, b'{'],
        b"",
    ];
    for body in bodies {
        let (status, _, answer) = http(
            &server.base,
            "POST",
            "/v1/repos/srv/commits",
            &[("Authorization", &auth)],
            body,
        );
        let text = String::from_utf8_lossy(&answer);
        assert_eq!(status, 400, "{text}");
        assert!(text.contains("invalid_safetensors"), "{text}");
        assert!(
            !text.contains(secret) && !text.contains("incoming"),
            "{text}"
        );
    }
    server.stop();
}
