//! A hostile peer for the client's tests: a proxy in front of a real `mdl serve` that passes
//! answers through, or in one of its modes tampers with what it sends back — names, lengths,
//! frames, refs, plans, bytes — or stalls, drips, lies about a length or an encoding. What it
//! forges it builds from the honest answer, so every other check the client makes still holds
//! and the one under test is the one that must refuse.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use crate::server::http;

/// What a route is, for the modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    Refs,
    Plan,
    Pack,
    Upload,
    Listing,
    File,
    Other,
}

impl Route {
    fn of(method: &str, path: &str) -> Route {
        let path = path.split('?').next().unwrap_or(path);
        let rest = path.splitn(5, '/').nth(4).unwrap_or(""); // after /v1/repos/NAME/
        match (method, rest) {
            ("GET", "refs") => Route::Refs,
            ("POST", "objects/plan") => Route::Plan,
            ("POST", "objects/fetch") => Route::Pack,
            ("POST", "objects") => Route::Upload,
            ("GET", r) if r.starts_with("files/") && r.matches('/').count() == 1 => Route::Listing,
            ("GET", r) if r.starts_with("files/") => Route::File,
            _ => Route::Other,
        }
    }
}

/// An answer as the proxy sends it.
pub(crate) struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
}

/// How an answer's body goes out.
pub(crate) enum Body {
    /// These bytes, with their length.
    Bytes(Vec<u8>),
    /// These bytes, then this one repeated forever, without a length (chunked).
    Endless(Vec<u8>, Vec<u8>),
    /// A length declared, these bytes sent, then nothing (the connection held open).
    Short(u64, Vec<u8>),
    /// Nothing at all, not even the status line; the connection held open.
    Stall,
    /// Headers with a length, then one byte a second.
    Drip(Vec<u8>),
}

/// What a mode does to one answer: given the route and the honest answer, the answer to send.
pub(crate) type Tamper = fn(Route, Answer) -> Answer;

/// What a mode does to a pack upload on its way to the server: given its body, how many of its
/// bytes go before the connection is cut (a client cut off mid-push; the client is answered
/// 502), or `None` for all of them.
pub(crate) type CutUpload = fn(&[u8]) -> Option<usize>;

/// A running proxy; it lives as long as the test process.
pub(crate) struct Proxy {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Proxy {
    /// A proxy to `upstream` (`http://127.0.0.1:PORT`) applying `tamper` to every answer.
    pub(crate) fn start(upstream: &str, tamper: Tamper) -> Proxy {
        Proxy::start_with(upstream, tamper, |_| None)
    }

    /// [`Proxy::start`], cutting pack uploads as `cut` says.
    pub(crate) fn start_with(upstream: &str, tamper: Tamper, cut: CutUpload) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let upstream = upstream.to_string();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let upstream = upstream.clone();
                std::thread::spawn(move || {
                    let _ = serve(conn, &upstream, tamper, cut);
                });
            }
        });
        Proxy { base }
    }
}

/// A request: method, path, headers, body.
struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn read_request(conn: &mut BufReader<TcpStream>) -> std::io::Result<Option<Request>> {
    let mut line = String::new();
    if conn.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        conn.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let get = |k: &str| headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if get("expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue")) {
        conn.get_mut().write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
    }
    if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            let mut size = String::new();
            conn.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0; n + 2];
            conn.read_exact(&mut chunk)?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else if let Some(n) = get("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.resize(n, 0);
        conn.read_exact(&mut body)?;
    }
    Ok(Some(Request {
        method,
        path,
        headers,
        body,
    }))
}

/// The honest answer to `req`, from the real server (`http://HOST:PORT`).
fn ask(upstream: &str, req: &Request) -> Answer {
    let headers: Vec<(&str, &str)> = req
        .headers
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "host" | "connection" | "content-length" | "transfer-encoding" | "expect"
            )
        })
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let (status, mut headers, body) = http(upstream, &req.method, &req.path, &headers, &req.body);
    headers.retain(|(k, _)| {
        !matches!(
            k.as_str(),
            "transfer-encoding" | "content-length" | "connection"
        )
    });
    Answer {
        status,
        headers,
        body: Body::Bytes(body),
    }
}

fn serve(conn: TcpStream, upstream: &str, tamper: Tamper, cut: CutUpload) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let Some(req) = read_request(&mut reader)? else {
        return Ok(());
    };
    let route = Route::of(&req.method, &req.path);
    if let Some(n) = (route == Route::Upload).then(|| cut(&req.body)).flatten() {
        send_cut(upstream, &req, n)?;
        let answer = Answer {
            status: 502,
            headers: Vec::new(),
            body: Body::Bytes(b"the upload was cut off".to_vec()),
        };
        return send(conn, answer);
    }
    let honest = ask(upstream, &req);
    let answer = tamper(route, honest);
    send(conn, answer)
}

/// Sends `req` to `upstream` with its whole length declared but only its body's first `n`
/// bytes, then closes the connection's sending side and waits for the server to answer.
fn send_cut(upstream: &str, req: &Request, n: usize) -> std::io::Result<()> {
    let mut up = TcpStream::connect(upstream.trim_start_matches("http://"))?;
    let mut head = format!("{} {} HTTP/1.1\r\nHost: proxy\r\n", req.method, req.path);
    for (k, v) in &req.headers {
        if !matches!(
            k.as_str(),
            "host" | "connection" | "expect" | "transfer-encoding"
        ) {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    head.push_str("\r\n");
    up.write_all(head.as_bytes())?;
    up.write_all(&req.body[..n])?;
    up.flush()?;
    up.shutdown(std::net::Shutdown::Write)?;
    let _ = up.read_to_end(&mut Vec::new());
    Ok(())
}

fn send(mut conn: TcpStream, answer: Answer) -> std::io::Result<()> {
    let held = Duration::from_secs(40);
    let mut head = format!("HTTP/1.1 {} X\r\nConnection: close\r\n", answer.status);
    for (k, v) in &answer.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    match answer.body {
        Body::Bytes(b) => {
            head.push_str(&format!("Content-Length: {}\r\n\r\n", b.len()));
            conn.write_all(head.as_bytes())?;
            conn.write_all(&b)?;
        }
        Body::Endless(first, then) => {
            head.push_str("Transfer-Encoding: chunked\r\n\r\n");
            conn.write_all(head.as_bytes())?;
            let chunk = |b: &[u8]| {
                let mut c = format!("{:x}\r\n", b.len()).into_bytes();
                c.extend_from_slice(b);
                c.extend_from_slice(b"\r\n");
                c
            };
            if !first.is_empty() {
                conn.write_all(&chunk(&first))?;
            }
            let piece = chunk(&then.repeat((1 << 16) / then.len().max(1) + 1));
            loop {
                conn.write_all(&piece)?;
            }
        }
        Body::Short(declared, b) => {
            head.push_str(&format!("Content-Length: {declared}\r\n\r\n"));
            conn.write_all(head.as_bytes())?;
            conn.write_all(&b)?;
            std::thread::sleep(held);
        }
        Body::Stall => std::thread::sleep(held),
        Body::Drip(b) => {
            head.push_str(&format!("Content-Length: {}\r\n\r\n", b.len()));
            conn.write_all(head.as_bytes())?;
            for byte in b {
                conn.write_all(&[byte])?;
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
    conn.flush()
}

/// The bytes of an honest answer (empty for any other body).
pub(crate) fn bytes(a: &Answer) -> &[u8] {
    match &a.body {
        Body::Bytes(b) => b,
        _ => &[],
    }
}

/// An answer of `status` with a JSON body.
pub(crate) fn json(status: u16, value: &serde_json::Value) -> Answer {
    Answer {
        status,
        headers: vec![("content-type".into(), "application/json".into())],
        body: Body::Bytes(serde_json::to_vec(value).unwrap()),
    }
}

/// A pack stream taken apart: its frames (id, declared length, body), without the end frame.
pub(crate) fn frames(pack: &[u8]) -> Vec<([u8; 32], u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 8;
    while at + 40 <= pack.len() {
        let id: [u8; 32] = pack[at..at + 32].try_into().unwrap();
        let len = u64::from_le_bytes(pack[at + 32..at + 40].try_into().unwrap());
        at += 40;
        if len == 0 && id == [0; 32] {
            break;
        }
        let n = if len == u64::MAX {
            19 + u16::from_le_bytes(pack[at + 17..at + 19].try_into().unwrap()) as usize
        } else {
            len as usize
        };
        out.push((id, len, pack[at..at + n].to_vec()));
        at += n;
    }
    out
}

/// A pack stream of `frames` (each written with its declared length), ended.
pub(crate) fn pack(frames: &[([u8; 32], u64, Vec<u8>)]) -> Vec<u8> {
    let mut out = b"MDLPACK1".to_vec();
    for (id, len, body) in frames {
        out.extend_from_slice(id);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(body);
    }
    out.extend_from_slice(&[0; 40]);
    out
}
