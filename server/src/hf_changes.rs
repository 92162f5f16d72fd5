//! A Hub commit request read as it is parsed: NDJSON, a header and one object per file added
//! or deleted, each inline file's base64 content decoded straight into its place in the
//! commit's tree. What the request holds in memory is a few small strings and a window of
//! the content, whatever its size (`huggingface_hub` sends every file inline unless
//! `--hf-lfs-from` says otherwise, so a 1 GiB file is a 1.4 GB line); paths are checked, and
//! a request with more files than the repository takes is refused at the file over the limit,
//! before the rest is written.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;

use base64::Engine as _;
use mdl_protocol::ErrorCode;

use crate::access::ApiResult;
use crate::error::ApiError;

/// The longest string taken other than a file's content (a summary, a description, a path).
const MAX_TEXT: usize = 1 << 20;
/// How deep an ignored value may nest.
const MAX_DEPTH: usize = 32;
/// Base64 characters decoded at a time.
const WINDOW: usize = 1 << 16;

/// A 400 saying `why`.
pub(crate) fn bad(why: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::BadRequest, why)
}

/// What a commit request asks for; its inline files are already in the tree.
#[derive(Default)]
pub(crate) struct Changes {
    pub(crate) summary: String,
    pub(crate) description: String,
    pub(crate) parent: Option<String>,
    /// Files sent inline, written under the tree: their paths.
    pub(crate) files: Vec<String>,
    /// Files uploaded through LFS: path and SHA-256.
    pub(crate) lfs: Vec<(String, String)>,
    pub(crate) deleted: Vec<String>,
}

impl Changes {
    /// Whether the request changes nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.files.is_empty() && self.lfs.is_empty() && self.deleted.is_empty()
    }
}

/// How many files a request may add, and what sets that number (said when it is passed).
#[derive(Clone, Debug)]
pub(crate) struct MaxFiles {
    pub(crate) files: u64,
    pub(crate) why: String,
}

impl MaxFiles {
    /// The fewer of `repo`'s `limits.files` and the files one commit may hold within the
    /// server's decode budget ([`mdl::files_within_budget`]).
    pub(crate) fn of(repo: &mdl::Repository) -> mdl::Result<Self> {
        let (limit, budget) = (mdl::files_allowed(repo)?, mdl::files_within_budget());
        Ok(if budget < limit {
            MaxFiles {
                files: budget,
                why: format!(
                    "what the server's --decode-memory ({} MiB) lets one commit hold: ask the \
                     server's owner to raise it",
                    mdl::budget::limit() >> 20
                ),
            }
        } else {
            MaxFiles::limit(limit)
        })
    }

    /// The repository's `limits.files`.
    pub(crate) fn limit(files: u64) -> Self {
        MaxFiles {
            files,
            why: "the repository's limit (`mdl config limits.files N` raises it)".into(),
        }
    }
}

/// Reads the request spooled at `body`, writing each inline file under `tree` (a fresh folder
/// the request owns) as it is read; at most `max_files` files added, refused at the first over.
pub(crate) fn read_changes(body: &Path, tree: &Path, max_files: &MaxFiles) -> ApiResult<Changes> {
    let file =
        File::open(body).map_err(|e| ApiError::internal(format!("reading the upload: {e}")))?;
    let mut scan = Scan {
        r: BufReader::with_capacity(1 << 20, file),
        op: 0,
    };
    let mut out = Changes::default();
    let mut placed = Placed::default();
    loop {
        scan.skip_ws()?;
        if scan.peek()?.is_none() {
            return Ok(out);
        }
        scan.op += 1;
        let op = scan.op(tree)?;
        let n = scan.op;
        let path = || {
            op.path
                .clone()
                .ok_or_else(|| bad(format!("line {n}: no \"path\"")))
        };
        match op.key.as_deref() {
            Some("header") => {
                out.summary = op.summary.unwrap_or_default();
                out.description = op.description.unwrap_or_default();
                out.parent = op.parent;
            }
            Some("file") => {
                let path = path()?;
                if op.encoding.as_deref() != Some("base64") {
                    return Err(bad(format!("{path}: only base64 content is taken")));
                }
                placed.add(tree, &path, max_files, op.content)?;
                out.files.push(path);
            }
            Some("deletedFile") | Some("deletedFolder") => out.deleted.push(path()?),
            Some("lfsFile") => {
                let path = path()?;
                if op.algo.as_deref().is_some_and(|a| a != "sha256") {
                    return Err(bad(format!("{path}: LFS objects are named by sha256")));
                }
                let oid = op.oid.ok_or_else(|| bad(format!("{path}: no \"oid\"")))?;
                placed.count(&path, max_files)?;
                out.lfs.push((path, oid));
            }
            Some(other) => {
                return Err(ApiError::new(
                    ErrorCode::Unsupported,
                    format!("commit operation {other:?} is not supported by mdl serve"),
                ))
            }
            None => return Err(bad(format!("line {n}: no \"key\""))),
        }
    }
}

/// The paths a request has added: no two the same file, none both a file and a folder.
#[derive(Default)]
struct Placed {
    files: HashSet<String>,
    folders: HashSet<String>,
}

impl Placed {
    /// Counts `path` as added, refusing it past `max_files` or where it clashes.
    fn count(&mut self, path: &str, max_files: &MaxFiles) -> ApiResult<()> {
        check_path(path)?;
        if self.folders.contains(path) || self.files.contains(path) {
            return Err(bad(format!(
                "{path:?} is given twice, or as a file and a folder"
            )));
        }
        for (i, _) in path.match_indices('/') {
            let folder = &path[..i];
            if self.files.contains(folder) {
                return Err(bad(format!("{folder:?} is both a file and a folder")));
            }
            self.folders.insert(folder.to_string());
        }
        self.files.insert(path.to_string());
        if self.files.len() as u64 > max_files.files {
            return Err(ApiError::new(
                ErrorCode::TooLarge,
                format!(
                    "the commit adds more than {} files, {}",
                    max_files.files, max_files.why
                ),
            ));
        }
        Ok(())
    }

    /// [`Placed::count`], and the file put at `path` under `root` (its folders made): its
    /// decoded `content`, or empty.
    #[allow(clippy::disallowed_methods)] // under the request's fresh folder
    fn add(
        &mut self,
        root: &Path,
        path: &str,
        max_files: &MaxFiles,
        content: Option<tempfile::TempPath>,
    ) -> ApiResult<()> {
        self.count(path, max_files)?;
        let at = root.join(path);
        if let Some(dir) = at.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| ApiError::internal(format!("making the folder of {path}: {e}")))?;
        }
        match content {
            Some(content) => std::fs::rename(&content, &at),
            None => File::create(&at).map(drop),
        }
        .map_err(|e| ApiError::internal(format!("writing {path}: {e}")))
    }
}

/// A tree path a client may name: mdl's rule for tree paths (relative, no `.`, `..` or `.mdl`
/// component, no control character, at most 4096 bytes), no backslash, no component longer
/// than a filesystem takes.
pub(crate) fn check_path(path: &str) -> ApiResult<()> {
    mdl_format::check_path(path).map_err(|e| bad(e.to_string()))?;
    if path.contains('\\') {
        return Err(bad(format!("{path:?}: holds a backslash")));
    }
    if path.split('/').any(|c| c.len() > 255) {
        return Err(bad(format!("{path:?}: a name longer than 255 bytes")));
    }
    Ok(())
}

/// One operation's fields.
#[derive(Default)]
struct Op {
    key: Option<String>,
    path: Option<String>,
    encoding: Option<String>,
    /// The decoded content, in a file under the tree until its path is known.
    content: Option<tempfile::TempPath>,
    summary: Option<String>,
    description: Option<String>,
    parent: Option<String>,
    oid: Option<String>,
    algo: Option<String>,
}

/// A reader of JSON objects one after another, each `{"key": …, "value": {…}}`.
struct Scan<R: BufRead> {
    r: R,
    /// The operation being read (1-based), for messages.
    op: u64,
}

impl<R: BufRead> Scan<R> {
    fn fail(&self, why: impl std::fmt::Display) -> ApiError {
        fail_at(self.op, why)
    }

    fn peek(&mut self) -> ApiResult<Option<u8>> {
        let op = self.op;
        let buf = self.r.fill_buf().map_err(|e| fail_at(op, e))?;
        Ok(buf.first().copied())
    }

    fn next(&mut self) -> ApiResult<u8> {
        let b = self.peek()?.ok_or_else(|| self.fail("cut short"))?;
        self.r.consume(1);
        Ok(b)
    }

    fn expect(&mut self, want: u8) -> ApiResult<()> {
        self.skip_ws()?;
        match self.next()? {
            b if b == want => Ok(()),
            b => Err(self.fail(format!(
                "{:?} where {:?} was expected",
                b as char, want as char
            ))),
        }
    }

    fn skip_ws(&mut self) -> ApiResult<()> {
        while let Some(b' ' | b'\t' | b'\r' | b'\n') = self.peek()? {
            self.r.consume(1);
        }
        Ok(())
    }

    /// The members of an object, `member` called with each key (the `{` not yet read).
    fn object(
        &mut self,
        mut member: impl FnMut(&mut Self, String) -> ApiResult<()>,
    ) -> ApiResult<()> {
        self.expect(b'{')?;
        self.skip_ws()?;
        if self.peek()? == Some(b'}') {
            self.r.consume(1);
            return Ok(());
        }
        loop {
            self.skip_ws()?;
            let key = self.text()?;
            self.expect(b':')?;
            self.skip_ws()?;
            member(self, key)?;
            self.skip_ws()?;
            match self.next()? {
                b',' => continue,
                b'}' => return Ok(()),
                b => return Err(self.fail(format!("{:?} in an object", b as char))),
            }
        }
    }

    /// One operation.
    fn op(&mut self, tree: &Path) -> ApiResult<Op> {
        let mut op = Op::default();
        self.object(|s, key| match key.as_str() {
            "key" => {
                op.key = Some(s.text()?);
                Ok(())
            }
            "value" => s.object(|s, field| {
                let slot = match field.as_str() {
                    "content" => {
                        op.content = Some(s.content(tree)?);
                        return Ok(());
                    }
                    "path" => &mut op.path,
                    "encoding" => &mut op.encoding,
                    "summary" => &mut op.summary,
                    "description" => &mut op.description,
                    "parentCommit" => &mut op.parent,
                    "oid" => &mut op.oid,
                    "algo" => &mut op.algo,
                    _ => return s.skip(0),
                };
                *slot = s.text_or_null()?;
                Ok(())
            }),
            _ => s.skip(1),
        })?;
        Ok(op)
    }

    /// A string, or `null` (none).
    fn text_or_null(&mut self) -> ApiResult<Option<String>> {
        if self.peek()? == Some(b'n') {
            self.skip(0)?;
            return Ok(None);
        }
        self.text().map(Some)
    }

    /// A string of at most [`MAX_TEXT`] bytes.
    fn text(&mut self) -> ApiResult<String> {
        let mut out = Vec::new();
        self.string(|s, chunk| {
            out.extend_from_slice(chunk);
            if out.len() > MAX_TEXT {
                return Err(s.fail(format!("a string over {MAX_TEXT} bytes")));
            }
            Ok(())
        })?;
        String::from_utf8(out).map_err(|_| self.fail("a string that is not UTF-8"))
    }

    /// A string of base64, decoded into a new file under `tree` a window at a time.
    #[allow(clippy::disallowed_methods)] // under the request's fresh folder
    fn content(&mut self, tree: &Path) -> ApiResult<tempfile::TempPath> {
        let (file, path) = tempfile::Builder::new()
            .prefix(".content-")
            .tempfile_in(tree)
            .map_err(|e| ApiError::internal(format!("writing an upload: {e}")))?
            .into_parts();
        let mut to = BufWriter::with_capacity(1 << 20, file);
        let mut pending: Vec<u8> = Vec::with_capacity(WINDOW + 4);
        let mut decoded = vec![0u8; WINDOW / 4 * 3 + 3];
        let mut padded = false;
        let mut flush = |s: &Self, pending: &mut Vec<u8>, all: bool| -> ApiResult<()> {
            let take = if all {
                pending.len()
            } else {
                pending.len() / 4 * 4
            };
            if take == 0 {
                return Ok(());
            }
            if padded {
                return Err(s.fail("base64 content goes on after its padding"));
            }
            padded = pending[..take].contains(&b'=');
            // A run is at most the reader's buffer (1 MiB) past the window.
            decoded.resize(take / 4 * 3 + 3, 0);
            let n = base64::engine::general_purpose::STANDARD
                .decode_slice(&pending[..take], &mut decoded)
                .map_err(|e| s.fail(format!("content that is not base64: {e}")))?;
            to.write_all(&decoded[..n])
                .map_err(|e| ApiError::internal(format!("writing an upload: {e}")))?;
            pending.drain(..take);
            Ok(())
        };
        self.string(|s, chunk| {
            pending.extend_from_slice(chunk);
            if pending.len() >= WINDOW {
                flush(s, &mut pending, false)?;
            }
            Ok(())
        })?;
        flush(self, &mut pending, true)?;
        to.flush()
            .map_err(|e| ApiError::internal(format!("writing an upload: {e}")))?;
        Ok(path)
    }

    /// A string's bytes, unescaped, handed to `chunk` a run at a time.
    fn string(&mut self, mut chunk: impl FnMut(&Self, &[u8]) -> ApiResult<()>) -> ApiResult<()> {
        self.expect(b'"')?;
        let op = self.op;
        loop {
            let buf = self.r.fill_buf().map_err(|e| fail_at(op, e))?;
            if buf.is_empty() {
                return Err(fail_at(op, "a string cut short"));
            }
            let run = buf
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
                .unwrap_or(buf.len());
            let (taken, stop) = (buf[..run].to_vec(), buf.get(run).copied());
            self.r.consume(run);
            chunk(self, &taken)?;
            match stop {
                None => continue,
                Some(b'"') => {
                    self.r.consume(1);
                    return Ok(());
                }
                Some(b'\\') => {
                    self.r.consume(1);
                    let c = self.escape()?;
                    let mut utf8 = [0u8; 4];
                    chunk(self, c.encode_utf8(&mut utf8).as_bytes())?;
                }
                Some(_) => return Err(self.fail("a control character in a string")),
            }
        }
    }

    /// The character an escape (after its backslash) stands for.
    fn escape(&mut self) -> ApiResult<char> {
        Ok(match self.next()? {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let hi = self.hex4()?;
                let code = if (0xD800..0xDC00).contains(&hi) {
                    if self.next()? != b'\\' || self.next()? != b'u' {
                        return Err(self.fail("a lone surrogate in a string"));
                    }
                    let lo = self.hex4()?;
                    if !(0xDC00..0xE000).contains(&lo) {
                        return Err(self.fail("a lone surrogate in a string"));
                    }
                    0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                } else {
                    hi
                };
                char::from_u32(code).ok_or_else(|| self.fail("a lone surrogate in a string"))?
            }
            b => return Err(self.fail(format!("an unknown escape \\{}", b as char))),
        })
    }

    fn hex4(&mut self) -> ApiResult<u32> {
        let mut v = 0;
        for _ in 0..4 {
            let d = (self.next()? as char)
                .to_digit(16)
                .ok_or_else(|| self.fail("a bad \\u escape"))?;
            v = v * 16 + d;
        }
        Ok(v)
    }

    /// Skips a value of any kind (bounded in depth; its strings bounded as [`Scan::text`]).
    fn skip(&mut self, depth: usize) -> ApiResult<()> {
        if depth > MAX_DEPTH {
            return Err(self.fail("values nested too deep"));
        }
        self.skip_ws()?;
        match self.peek()?.ok_or_else(|| self.fail("cut short"))? {
            b'{' => self.object(|s, _| s.skip(depth + 1)),
            b'[' => {
                self.r.consume(1);
                self.skip_ws()?;
                if self.peek()? == Some(b']') {
                    self.r.consume(1);
                    return Ok(());
                }
                loop {
                    self.skip(depth + 1)?;
                    self.skip_ws()?;
                    match self.next()? {
                        b',' => continue,
                        b']' => return Ok(()),
                        b => return Err(self.fail(format!("{:?} in an array", b as char))),
                    }
                }
            }
            b'"' => self.text().map(drop),
            _ => {
                // A number, true, false or null: its characters up to the next delimiter.
                let mut len = 0;
                while let Some(b) = self.peek()? {
                    if matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\r' | b'\n') {
                        break;
                    }
                    if !(b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.')) || len > 64 {
                        return Err(
                            self.fail(format!("{:?} where a value was expected", b as char))
                        );
                    }
                    self.r.consume(1);
                    len += 1;
                }
                if len == 0 {
                    return Err(self.fail("a value was expected"));
                }
                Ok(())
            }
        }
    }
}

fn fail_at(op: u64, why: impl std::fmt::Display) -> ApiError {
    bad(format!("line {op}: {why}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::disallowed_methods)]
    use super::*;

    fn read(body: &str, max_files: u64) -> (ApiResult<Changes>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let spooled = dir.path().join("body");
        std::fs::write(&spooled, body).unwrap();
        let tree = dir.path().join("tree");
        std::fs::create_dir(&tree).unwrap();
        (
            read_changes(&spooled, &tree, &MaxFiles::limit(max_files)),
            dir,
        )
    }

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn files_are_decoded_into_the_tree_whatever_the_key_order_and_escapes() {
        let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let body = format!(
            "{{\"key\":\"header\",\"value\":{{\"summary\":\"s \\u00e9\\ud83d\\ude00\",\"description\":\"d\",\"parentCommit\":null,\"extra\":[1,{{\"a\":true}}]}}}}\n\
             {{\"value\":{{\"content\":\"{}\",\"path\":\"a/b.bin\",\"encoding\":\"base64\"}},\"key\":\"file\"}}\n\
             {{\"key\":\"file\",\"value\":{{\"path\":\"c.txt\",\"encoding\":\"base64\",\"content\":\"{}\"}}}}\n\
             {{\"key\":\"lfsFile\",\"value\":{{\"path\":\"w.bin\",\"algo\":\"sha256\",\"oid\":\"ab\",\"size\":3}}}}\n\
             {{\"key\":\"deletedFile\",\"value\":{{\"path\":\"old.txt\"}}}}\n",
            b64(&big).replace('/', "\\/"),
            b64(b"hello")
        );
        let (changes, dir) = read(&body, 10);
        let changes = changes.unwrap();
        assert_eq!(changes.summary, "s \u{e9}\u{1F600}");
        assert_eq!(changes.parent, None);
        assert_eq!(changes.files, ["a/b.bin", "c.txt"]);
        assert_eq!(changes.lfs, [("w.bin".to_string(), "ab".to_string())]);
        assert_eq!(changes.deleted, ["old.txt"]);
        let tree = dir.path().join("tree");
        assert_eq!(std::fs::read(tree.join("a/b.bin")).unwrap(), big);
        assert_eq!(std::fs::read(tree.join("c.txt")).unwrap(), b"hello");
    }

    #[test]
    fn bad_requests_are_refused_naming_what() {
        let file = |path: &str, content: &str| {
            format!(
                "{{\"key\":\"file\",\"value\":{{\"path\":{},\"encoding\":\"base64\",\"content\":\"{content}\"}}}}\n",
                serde_json::to_string(path).unwrap()
            )
        };
        let ok = b64(b"x");
        let long_name = "n".repeat(300);
        let cases = [
            (file(".mdl/x", &ok), "repository folder"),
            (file("dir/.mdl/y", &ok), "repository folder"),
            (file("x\0y", &ok), "control character"),
            (file(&long_name, &ok), "longer than 255"),
            (file(&"d/".repeat(2100).to_string(), &ok), "too long"),
            (
                file("ff", &ok) + &file("ff/x", &ok),
                "both a file and a folder",
            ),
            (file("ff/x", &ok) + &file("ff", &ok), "a file and a folder"),
            (file("a", "AB==CDEF"), "not base64"),
            (file("a", "!!!!"), "not base64"),
            (file("a", &ok)[..30].to_string(), "cut short"),
            ("{\"key\":\"file\"".to_string(), "cut short"),
            ("[1]".to_string(), "where '{' was expected"),
            ("{\"value\":{}}".to_string(), "no \"key\""),
        ];
        for (body, want) in cases {
            let (got, _dir) = read(&body, 10);
            let e = got.err().unwrap_or_else(|| panic!("{body:?} was taken"));
            assert_eq!(e.code, ErrorCode::BadRequest, "{body:?}: {}", e.message);
            assert!(e.message.contains(want), "{body:?}: {}", e.message);
        }
    }

    #[test]
    fn content_with_padding_inside_is_refused() {
        let padded = b64(b"x"); // "eA=="
        let body = format!(
            "{{\"key\":\"file\",\"value\":{{\"path\":\"a\",\"encoding\":\"base64\",\"content\":\"{}{}\"}}}}\n",
            padded.repeat(WINDOW / 4),
            "QUJD".repeat(10)
        );
        let (got, _dir) = read(&body, 10);
        let e = got.err().unwrap();
        assert!(
            e.message.contains("after its padding") || e.message.contains("not base64"),
            "{}",
            e.message
        );
    }

    #[test]
    fn more_files_than_the_limit_are_refused_at_the_first_over_it() {
        let body: String = (0..10)
            .map(|i| {
                format!(
                    "{{\"key\":\"file\",\"value\":{{\"path\":\"f{i}\",\"encoding\":\"base64\",\"content\":\"eA==\"}}}}\n"
                )
            })
            .collect();
        let (got, dir) = read(&body, 3);
        let e = got.err().unwrap();
        assert_eq!(e.code, ErrorCode::TooLarge, "{}", e.message);
        // Refused at the fourth: the rest was never written.
        let written = std::fs::read_dir(dir.path().join("tree")).unwrap().count();
        assert!(written <= 4, "{written} files written");
    }
}
