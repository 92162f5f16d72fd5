//! Xet's upload protocol, as much of it as `huggingface_hub` with `hf_xet` (a default install)
//! needs to publish large files to mdl: a write token, xorb uploads, and shard uploads
//! (the Xet protocol specification: xorb, shard and CAS API documents).
//!
//! The client cuts each file into chunks, packs them into xorbs (at most 64 MiB, each chunk
//! LZ4- or byte-grouped-LZ4-compressed or stored), uploads the xorbs, then a shard naming every
//! file as ranges of xorb chunks with its SHA-256, then commits naming each file by that
//! SHA-256 (`lfsFile`). mdl keeps the xorbs in the repository's `incoming/` as `xet-HASH` and,
//! when the shard comes, rebuilds each file from them and keeps it as `lfs-SHA256` — the same
//! staged object a git LFS upload leaves (`hf_lfs.rs`), so the commit route takes it the same
//! way. A rebuilt file whose SHA-256 is not the one the shard says is refused: what is committed
//! is exactly what the client hashed. Xorb and chunk hashes are not checked (they are the
//! client's names for its pieces; mdl keeps none of them past the commit), and nothing is
//! deduplicated against earlier uploads (the global-dedup query says no chunk is known).
//!
//! The CAS routes are under `/hf/.xet/{repo}`, authorised by the token the token route hands
//! out (a keyed hash of the repository and its expiry), since `hf_xet` sends no other.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State as AxState};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use mdl_protocol::ErrorCode;
use serde_json::json;
use sha2::Digest;

use crate::access::{blocking, Access, ApiResult, Writer};
use crate::auth::bearer;
use crate::error::ApiError;
use crate::hf_lfs::{now, staged_path, sweep, ticket};
use crate::upload::spool;
use crate::{Served, State};

type Shared = AxState<Arc<State>>;

/// How long a write token is good for (the client asks again when it runs out).
const TOKEN_LIFETIME: u64 = 3600;

/// The largest xorb the protocol allows, serialised (its footer beside).
const MAX_XORB: u64 = 64 << 20;

/// The largest chunk, uncompressed (and so stored: a chunk that would grow is stored as is).
const MAX_CHUNK: usize = 128 << 10;

/// The routes, nested under `/hf` with the others.
pub(crate) fn routes() -> Router<Arc<State>> {
    Router::new()
        .route("/api/models/{repo}/xet-write-token/{rev}", get(write_token))
        .route("/.xet/{repo}/v1/xorbs/{prefix}/{hash}", post(xorb))
        .route("/.xet/{repo}/v1/chunks/{prefix}/{hash}", get(no_chunk))
        .route("/.xet/{repo}/v1/shards", post(shard))
}

/// `GET /api/models/{repo}/xet-write-token/{rev}` (write scope): where the CAS routes are and
/// the token they take, in the headers the client reads.
async fn write_token(
    Access(served): Writer,
    Path((repo, _)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    // A session starts here: what earlier ones left a day ago goes.
    blocking(move || {
        sweep(&served);
        Ok(())
    })
    .await?;
    let expires = now() + TOKEN_LIFETIME;
    let cas = format!(
        "{}{}/.xet/{}",
        crate::web::origin(&headers),
        crate::hf::PREFIX,
        mdl_protocol::route::segment(&repo)
    );
    let token = format!("{expires}.{}", ticket(&repo, "xet", 0, expires));
    // In the headers (read by huggingface_hub) and the body (read by hf_xet).
    Ok((
        [
            ("x-xet-cas-url", cas.clone()),
            ("x-xet-access-token", token.clone()),
            ("x-xet-token-expiration", expires.to_string()),
        ],
        Json(json!({ "casUrl": cas, "accessToken": token, "exp": expires })),
    )
        .into_response())
}

/// The repository `name`, when the request carries a write token [`write_token`] gave for it.
async fn authorised(state: &Arc<State>, name: &str, headers: &HeaderMap) -> ApiResult<Arc<Served>> {
    let presented = bearer(headers).and_then(|t| t.split_once('.'));
    let valid = presented.is_some_and(|(expires, mac)| {
        expires
            .parse::<u64>()
            .is_ok_and(|e| e >= now() && ticket(name, "xet", 0, e) == mac)
    });
    if !valid {
        return Err(ApiError::new(
            ErrorCode::Unauthorized,
            "the Xet token is not valid (expired, or not this server's): ask the token route again",
        ));
    }
    let (state, name) = (state.clone(), name.to_string());
    blocking(move || Ok(state.repo(&name)?)).await
}

/// A xorb's or file's hash as the protocol writes it in paths: 64 lowercase hex digits.
fn checked_hash(hash: &str) -> ApiResult<&str> {
    let ok = hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    ok.then_some(hash).ok_or_else(|| {
        bad(format!(
            "{hash:?} is not a Xet hash (64 lowercase hex digits)"
        ))
    })
}

fn bad(why: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::BadBody, why)
}

/// Where xorb `hash` waits for its shard.
fn xorb_path(served: &Served, hash: &str) -> ApiResult<PathBuf> {
    Ok(served.repo.incoming_path()?.join(format!("xet-{hash}")))
}

/// `POST /.xet/{repo}/v1/xorbs/{prefix}/{hash}`: a xorb, its chunks checked readable, kept
/// until a shard names it.
async fn xorb(
    AxState(state): Shared,
    Path((name, _, hash)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let served = authorised(&state, &name, &headers).await?;
    let hash = checked_hash(&hash)?.to_string();
    let spooled = spool(&served, &headers, body, MAX_XORB + (1 << 20)).await?;
    blocking(move || {
        let target = xorb_path(&served, &hash)?;
        if target.exists() {
            return Ok(Json(json!({ "was_inserted": false })).into_response());
        }
        let bytes = std::fs::read(spooled.path())
            .map_err(|e| ApiError::internal(format!("reading the upload: {e}")))?;
        if chunk_offsets(&bytes)?.is_empty() {
            return Err(bad("the xorb holds no chunk"));
        }
        spooled
            .persist(&target)
            .map_err(|e| ApiError::internal(format!("staging the xorb: {e}")))?;
        Ok(Json(json!({ "was_inserted": true })).into_response())
    })
    .await
}

/// `GET /.xet/{repo}/v1/chunks/{prefix}/{hash}`: no chunk is known from earlier uploads.
async fn no_chunk() -> ApiError {
    ApiError::not_found("mdl keeps no Xet chunks for deduplication")
}

/// Where each chunk of a serialised xorb starts: headers walked from the start until the
/// bytes end or the footer begins (a byte that is no chunk header's version).
fn chunk_offsets(xorb: &[u8]) -> ApiResult<Vec<usize>> {
    let mut offsets = Vec::new();
    let mut at = 0;
    while at < xorb.len() && xorb[at] == 0 {
        let header = chunk_header(xorb, at)?;
        offsets.push(at);
        at += 8 + header.stored;
    }
    Ok(offsets)
}

/// A chunk header: the stored length, the scheme and the length once decompressed.
struct ChunkHeader {
    stored: usize,
    scheme: u8,
    raw: usize,
}

fn chunk_header(xorb: &[u8], at: usize) -> ApiResult<ChunkHeader> {
    let h = xorb
        .get(at..at + 8)
        .ok_or_else(|| bad("a xorb's chunk header is cut short"))?;
    let u24 = |b: &[u8]| usize::from(b[0]) | usize::from(b[1]) << 8 | usize::from(b[2]) << 16;
    let header = ChunkHeader {
        stored: u24(&h[1..4]),
        scheme: h[4],
        raw: u24(&h[5..8]),
    };
    if h[0] != 0 || header.scheme > 2 || header.raw > MAX_CHUNK {
        return Err(bad(format!(
            "a xorb's chunk header at byte {at} is not one mdl reads"
        )));
    }
    if at + 8 + header.stored > xorb.len() {
        return Err(bad("a xorb's chunk is cut short"));
    }
    Ok(header)
}

/// Chunk `index` of `xorb`, decompressed.
fn chunk(xorb: &[u8], offsets: &[usize], index: usize) -> ApiResult<Vec<u8>> {
    let at = *offsets.get(index).ok_or_else(|| {
        bad(format!(
            "a shard names chunk {index} of a xorb of {}",
            offsets.len()
        ))
    })?;
    let h = chunk_header(xorb, at)?;
    let stored = &xorb[at + 8..at + 8 + h.stored];
    let mut out = Vec::with_capacity(h.raw);
    match h.scheme {
        0 => out.extend_from_slice(stored),
        _ => {
            // At most one byte past the announced length is read, so a chunk that says it is
            // small cannot make the server inflate a large one.
            lz4_flex::frame::FrameDecoder::new(stored)
                .take(h.raw as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| bad(format!("a xorb's chunk does not decompress: {e}")))?;
        }
    }
    if out.len() != h.raw {
        return Err(bad("a xorb's chunk is not the length its header says"));
    }
    Ok(if h.scheme == 2 { regroup(&out) } else { out })
}

/// Byte grouping undone: `grouped` holds byte 0 of every 4, then byte 1, 2 and 3 (the first
/// `len % 4` groups one longer).
fn regroup(grouped: &[u8]) -> Vec<u8> {
    let n = grouped.len();
    let mut starts = [0usize; 4];
    for g in 1..4 {
        starts[g] = starts[g - 1] + n / 4 + usize::from(g - 1 < n % 4);
    }
    (0..n).map(|i| grouped[starts[i % 4] + i / 4]).collect()
}

/// A hash as the protocol writes it: each 8-byte quarter read as a little-endian number.
fn hash_hex(raw: &[u8]) -> String {
    raw.chunks(8)
        .flat_map(|q| q.iter().rev())
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One file of a shard: the ranges of xorb chunks it is made of, and its SHA-256.
struct ShardFile {
    ranges: Vec<(String, u32, u32, u32)>,
    sha256: Option<String>,
}

/// The files a shard describes (its file-info section, up to the bookend).
fn shard_files(shard: &[u8]) -> ApiResult<Vec<ShardFile>> {
    let cut = || bad("the shard is cut short");
    let entry = |at: usize| shard.get(at..at + 48).ok_or_else(cut);
    let u32_at = |b: &[u8], i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let header = shard.get(..48).ok_or_else(cut)?;
    if u64::from_le_bytes(header[32..40].try_into().expect("8 bytes")) != 2 {
        return Err(bad("the shard is not of version 2"));
    }
    let mut files = Vec::new();
    let mut at = 48;
    loop {
        let head = entry(at)?;
        at += 48;
        if head[..32].iter().all(|&b| b == 0xff) {
            return Ok(files);
        }
        let (flags, count) = (u32_at(head, 32), u32_at(head, 36) as usize);
        let mut ranges = Vec::with_capacity(count.min(1 << 16));
        for _ in 0..count {
            let e = entry(at)?;
            at += 48;
            ranges.push((
                hash_hex(&e[..32]),
                u32_at(e, 36),
                u32_at(e, 40),
                u32_at(e, 44),
            ));
        }
        if flags & (1 << 31) != 0 {
            at += 48 * count; // verification entries: range hashes mdl does not check
        }
        let sha256 = if flags & (1 << 30) != 0 {
            let e = entry(at)?;
            at += 48;
            // Kept as the protocol keeps every hash, a quarter at a time.
            Some(hash_hex(&e[..32]))
        } else {
            None
        };
        files.push(ShardFile { ranges, sha256 });
    }
}

/// `POST /.xet/{repo}/v1/shards`: each file the shard describes rebuilt from its xorbs and
/// staged by SHA-256 for the commit that names it.
async fn shard(
    AxState(state): Shared,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let served = authorised(&state, &name, &headers).await?;
    let spooled = spool(&served, &headers, body, MAX_XORB).await?;
    let max = state.config.max_body;
    blocking(move || {
        let bytes = std::fs::read(spooled.path())
            .map_err(|e| ApiError::internal(format!("reading the upload: {e}")))?;
        let files = shard_files(&bytes)?;
        // A file is bounded like any upload, before a byte of it is written.
        for file in &files {
            let len: u64 = file.ranges.iter().map(|r| u64::from(r.1)).sum();
            if len > max {
                return Err(ApiError::new(
                    ErrorCode::BodyTooLarge,
                    format!(
                        "a file of the shard is {len} bytes, over the server's --max-body {max}"
                    ),
                ));
            }
        }
        for file in &files {
            rebuild(&served, file)?;
        }
        Ok(Json(json!({ "result": 1 })).into_response())
    })
    .await
}

/// Writes `file` from its xorbs into the repository's `incoming/`, checks its SHA-256 and
/// stages it as `lfs-SHA256`.
fn rebuild(served: &Served, file: &ShardFile) -> ApiResult<()> {
    let io = |e: std::io::Error| ApiError::internal(format!("rebuilding a Xet file: {e}"));
    let incoming = served.repo.incoming_path()?;
    let mut out = tempfile::NamedTempFile::new_in(&incoming).map_err(io)?;
    let mut hasher = sha2::Sha256::new();
    // The xorb in use (its name, bytes and chunk offsets), read once for the consecutive
    // ranges that name it.
    let mut held: Option<(&str, Vec<u8>, Vec<usize>)> = None;
    for (xorb, bytes, start, end) in &file.ranges {
        if held.as_ref().is_none_or(|(name, ..)| name != xorb) {
            let path = xorb_path(served, checked_hash(xorb)?)?;
            let data = std::fs::read(&path).map_err(|_| {
                bad(format!(
                    "the shard names xorb {xorb}, which was not uploaded here (a client's Xet cache from another server: clear it, or set HF_HUB_DISABLE_XET=1)"
                ))
            })?;
            let offsets = chunk_offsets(&data)?;
            held = Some((xorb, data, offsets));
        }
        let (_, data, offsets) = held.as_ref().expect("read above");
        let mut written = 0u64;
        for index in *start..*end {
            let piece = chunk(data, offsets, index as usize)?;
            hasher.update(&piece);
            out.write_all(&piece).map_err(io)?;
            written += piece.len() as u64;
        }
        if written != u64::from(*bytes) {
            return Err(bad("a shard's range is not the length it says"));
        }
    }
    let digest: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if file.sha256.as_ref().is_some_and(|s| *s != digest) {
        return Err(bad(format!(
            "a file rebuilt from its xorbs has SHA-256 {digest}, not the {} its shard says",
            file.sha256.as_deref().unwrap_or_default()
        )));
    }
    out.persist(staged_path(served, &digest)?)
        .map_err(|e| ApiError::internal(format!("staging a Xet file: {e}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Whatever a client sends as a xorb or a shard is read or refused, never a panic.
        #[test]
        fn any_bytes_are_read_or_refused(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
            if let Ok(offsets) = chunk_offsets(&bytes) {
                for i in 0..offsets.len() + 1 {
                    let _ = chunk(&bytes, &offsets, i);
                }
            }
            let _ = shard_files(&bytes);
            let mut versioned = bytes.clone();
            if versioned.len() >= 48 {
                versioned[32..40].copy_from_slice(&2u64.to_le_bytes());
                let _ = shard_files(&versioned);
            }
        }
    }

    #[test]
    fn byte_groups_come_back_in_order() {
        for n in 0..13 {
            let data: Vec<u8> = (0..n as u8).collect();
            let mut grouped = Vec::new();
            for g in 0..4 {
                grouped.extend(data.iter().skip(g).step_by(4));
            }
            assert_eq!(regroup(&grouped), data, "{n} bytes");
        }
    }

    #[test]
    fn hashes_are_written_a_quarter_at_a_time() {
        let raw: Vec<u8> = (0..32).collect();
        assert_eq!(
            hash_hex(&raw),
            "07060504030201000f0e0d0c0b0a090817161514131211101f1e1d1c1b1a1918"
        );
    }

    #[test]
    fn chunks_are_read_by_their_headers_and_refused_when_they_lie() {
        let raw = b"abcdefgh".repeat(100);
        let compressed = {
            let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
            e.write_all(&raw).unwrap();
            e.finish().unwrap()
        };
        let header = |stored: usize, scheme: u8, len: usize| {
            let mut h = vec![0u8];
            h.extend_from_slice(&(stored as u32).to_le_bytes()[..3]);
            h.push(scheme);
            h.extend_from_slice(&(len as u32).to_le_bytes()[..3]);
            h
        };
        let mut xorb = header(compressed.len(), 1, raw.len());
        xorb.extend_from_slice(&compressed);
        xorb.extend(header(3, 0, 3));
        xorb.extend_from_slice(b"xyz");
        xorb.extend_from_slice(b"XETBLOB footer");
        let offsets = chunk_offsets(&xorb).unwrap();
        assert_eq!(offsets.len(), 2);
        assert_eq!(chunk(&xorb, &offsets, 0).unwrap(), raw);
        assert_eq!(chunk(&xorb, &offsets, 1).unwrap(), b"xyz");
        assert!(chunk(&xorb, &offsets, 2).is_err());
        // A header that says less than the chunk inflates to is refused, not followed.
        let mut lying = header(compressed.len(), 1, 10);
        lying.extend_from_slice(&compressed);
        assert!(chunk(&lying, &chunk_offsets(&lying).unwrap(), 0).is_err());
        let mut short = header(100, 0, 100);
        short.extend_from_slice(b"abc");
        assert!(chunk_offsets(&short).is_err());
    }
}
