//! Repositories written by earlier builds, one per format version (`tests/fixtures/vN`, made
//! once by `scripts/make-fixtures.sh N` with the build that wrote version N), read back with
//! today's code: every record has the version the fixture claims, the refs are where that
//! build left them, fsck finds nothing wrong, and every commit checks out byte for byte as
//! that build checked it out. The same checkpoint committed today gets the same ids it got
//! then. Together the fixtures hold a record of every codec tag.

// Tests, examples and benchmarks write their own files (checkpoints, outputs, damage done on
// purpose); the rule that repository writes go through mdl-store is for the library crates.
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use mdl::checkout::{checkout, CheckoutOptions};
use mdl::commit::{commit, CommitOptions};
use mdl::{NoProgress, OpenOptions, Repository};
use mdl_codec::CodecTag;
use mdl_format::record::RecordHeader;
use mdl_format::FORMAT_VERSION;

#[derive(serde::Deserialize)]
struct Expected {
    format_version: u16,
    head: String,
    refs: BTreeMap<String, String>,
    checkouts: BTreeMap<String, String>,
    codecs: Vec<u8>,
    /// Masked delta records (format 11 on; absent before).
    #[serde(default)]
    masked: usize,
    /// Masked delta records whose mask is run-coded (format 12 on; absent before).
    #[serde(default)]
    runs: usize,
}

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("expected.json").exists())
        .collect();
    dirs.sort();
    dirs
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Every record's header in a repository's object folder, with the first byte of its payload
/// where it is a masked delta (1, or 9 where the mask is run-coded).
fn record_headers(objects: &Path) -> Vec<(PathBuf, RecordHeader, Option<u8>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(objects).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(record_headers(&path));
        } else {
            let bytes = std::fs::read(&path).unwrap();
            let (header, len) =
                RecordHeader::decode(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let delta = [CodecTag::XorDelta as u8, CodecTag::SubDelta as u8];
            let masked = bytes
                .get(len)
                .copied()
                .filter(|b| delta.contains(&header.codec) && matches!(b, 1 | 9));
            found.push((path, header, masked));
        }
    }
    found
}

#[test]
fn every_format_version_reads_back_bit_exactly() {
    let dirs = fixtures();
    let mut codecs = BTreeSet::new();
    for dir in &dirs {
        codecs.extend(check_fixture(dir));
    }
    let versions: BTreeSet<u16> = dirs
        .iter()
        .map(|d| read_expected(d).format_version)
        .collect();
    assert_eq!(
        versions,
        (1..=FORMAT_VERSION).collect(),
        "a fixture for every format version this build claims to read (scripts/make-fixtures.sh)"
    );
    assert!(
        dirs.iter().any(|d| read_expected(d).masked > 0),
        "a fixture holds a masked delta record"
    );
    assert!(
        dirs.iter().any(|d| read_expected(d).runs > 0),
        "a fixture holds a masked delta record with a run-coded mask"
    );
    let known: BTreeSet<u8> = (0..=u8::MAX)
        .filter(|t| CodecTag::try_from(*t).is_ok())
        .collect();
    assert_eq!(
        codecs, known,
        "the fixtures hold a record of every codec tag"
    );
}

fn read_expected(dir: &Path) -> Expected {
    let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A file's bytes, or a folder's files by relative path with their bytes and modes.
fn tree_bytes(path: &Path) -> BTreeMap<String, (Vec<u8>, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    let mut todo = vec![path.to_path_buf()];
    while let Some(p) = todo.pop() {
        if p.is_dir() {
            todo.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else {
            let rel = p.strip_prefix(path).unwrap().to_string_lossy().into_owned();
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o111;
            out.insert(rel, (std::fs::read(&p).unwrap(), mode));
        }
    }
    out
}

/// Checks one fixture; returns the codec tags its records use.
fn check_fixture(dir: &Path) -> BTreeSet<u8> {
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let expected = read_expected(dir);
    let tmp = tempfile::tempdir().unwrap();
    let repo_dir = tmp.path().join("repo");
    copy_tree(&dir.join("repo"), &repo_dir);

    // The records are what that build wrote: its version, the codecs it used.
    let headers = record_headers(&repo_dir.join(".mdl/objects"));
    assert!(!headers.is_empty(), "{name}: no records");
    for (path, header, _) in &headers {
        assert_eq!(
            header.version,
            expected.format_version,
            "{name}: {}",
            path.display()
        );
    }
    let masked = headers.iter().filter(|(_, _, m)| m.is_some()).count();
    assert_eq!(masked, expected.masked, "{name}: masked delta records");
    let runs = headers.iter().filter(|(_, _, m)| *m == Some(9)).count();
    assert_eq!(
        runs, expected.runs,
        "{name}: masked delta records with run-coded masks"
    );
    let codecs: BTreeSet<u8> = headers.iter().map(|(_, h, _)| h.codec).collect();
    assert_eq!(
        codecs,
        expected.codecs.iter().copied().collect(),
        "{name}: codecs"
    );

    let repo = Repository::open(&repo_dir, &OpenOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        repo.head_branch().unwrap(),
        format!("refs/heads/{}", expected.head)
    );
    let mut refs = BTreeMap::new();
    for r in mdl::refs::branches(&repo).unwrap() {
        refs.insert(format!("refs/heads/{}", r.name), r.target.to_hex());
    }
    for r in mdl::refs::tags(&repo).unwrap() {
        refs.insert(format!("refs/tags/{}", r.name), r.target.to_hex());
    }
    assert_eq!(refs, expected.refs, "{name}: refs");

    let report = mdl::fsck::fsck(&repo, false).unwrap();
    assert!(report.ok(), "{name}: fsck: {:?}", report.problems);

    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    for (file, commit_id) in &expected.checkouts {
        let path = out.join(file);
        checkout(
            &repo,
            commit_id,
            &path,
            &CheckoutOptions::default(),
            &NoProgress,
        )
        .unwrap_or_else(|e| panic!("{name}: checkout {commit_id}: {e}"));
        let then = dir.join("checkouts").join(file);
        let zst = dir.join("checkouts").join(format!("{file}.zst"));
        let same = if zst.exists() {
            // A large checkout, kept compressed.
            let bytes = std::fs::read(&zst).unwrap();
            std::fs::read(&path).unwrap() == zstd::decode_all(&bytes[..]).unwrap()
        } else {
            tree_bytes(&path) == tree_bytes(&then)
        };
        assert!(
            same,
            "{name}: {file} differs from the checkout of its build"
        );
    }

    // Identity by content: the first checkpoint (stored exactly) committed today, into a new
    // repository, gets the tensor ids it got from the build that wrote the fixture; and the
    // same manifest id where the manifest layout is today's (version 4 on; before it, the
    // manifest described one unnamed file).
    let (first_file, first_commit) = expected.checkouts.iter().next().unwrap();
    let then = mdl::show::show(&repo, first_commit).unwrap();
    let fresh = Repository::init(&tmp.path().join("fresh")).unwrap();
    // Under the name it was committed with (a manifest of version 2 records it).
    let named = tmp.path().join("named");
    std::fs::create_dir(&named).unwrap();
    let input = named.join(&then.files[0].path);
    std::fs::copy(dir.join("checkouts").join(first_file), &input).unwrap();
    let now = commit(&fresh, &input, &CommitOptions::default(), &NoProgress).unwrap();
    let now = mdl::show::show(&fresh, &now.id.to_hex()).unwrap();
    let ids = |s: &mdl::show::Shown| -> Vec<(String, String)> {
        s.tensors
            .iter()
            .map(|t| (t.name.clone(), t.id.to_hex()))
            .collect()
    };
    assert_eq!(ids(&now), ids(&then), "{name}: the same tensors, other ids");
    if expected.format_version >= 4 {
        assert_eq!(
            now.manifest, then.manifest,
            "{name}: the same checkpoint, another id"
        );
    }
    codecs
}
