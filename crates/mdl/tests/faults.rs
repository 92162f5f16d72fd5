//! Disk-full and failed-rename faults during a commit leave the repository exactly as it was.

use std::sync::Arc;

use mdl::commit::{commit, CommitOptions};
use mdl::{FaultyFs, NoProgress, OpenOptions, Repository};

fn checkpoint(path: &std::path::Path, seed: u8) {
    let n = 200_000usize;
    let header = format!(
        r#"{{"a":{{"dtype":"U8","shape":[{n}],"data_offsets":[0,{n}]}},"b":{{"dtype":"U8","shape":[{n}],"data_offsets":[{n},{}]}}}}"#,
        2 * n
    );
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    let mut x = seed as u64 | 1;
    bytes.extend((0..2 * n).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    }));
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn faults_leave_repository_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path()).unwrap();
    let f = dir.path().join("c.safetensors");
    checkpoint(&f, 3);
    let first = commit(&repo, &f, &CommitOptions::default(), &NoProgress).unwrap();
    drop(repo);
    checkpoint(&f, 7);
    let faults = [
        FaultyFs::disk_full_after(0),
        FaultyFs::disk_full_after(1000),
        FaultyFs::disk_full_after(150_000),
        FaultyFs::disk_full_after(250_000),
        FaultyFs::renames_fail_after(0),
        FaultyFs::renames_fail_after(1),
        FaultyFs::renames_fail_after(2),
    ];
    for fault in faults {
        let opts = OpenOptions {
            storage: Arc::new(fault),
            ..OpenOptions::default()
        };
        let repo = Repository::open(dir.path(), &opts).unwrap();
        let err = commit(&repo, &f, &CommitOptions::default(), &NoProgress).unwrap_err();
        assert!(!err.to_string().contains('\n'));
        assert_eq!(
            mdl::revision::resolve(&repo, "main").unwrap(),
            first.id,
            "{err}"
        );
        assert_eq!(mdl::log::log(&repo, None, None).unwrap().len(), 1);
        let report = mdl::fsck::fsck(&repo).unwrap();
        assert!(report.ok(), "{:?}", report.problems);
        assert!(
            report.temp_files.is_empty(),
            "temporary files left behind: {:?}",
            report.temp_files
        );
    }
    // The same commit succeeds once the disk has room again.
    let repo = Repository::open(dir.path(), &OpenOptions::default()).unwrap();
    let second = commit(&repo, &f, &CommitOptions::default(), &NoProgress).unwrap();
    assert_eq!(mdl::revision::resolve(&repo, "main~1").unwrap(), first.id);
    assert_eq!(mdl::revision::resolve(&repo, "main").unwrap(), second.id);
    assert!(mdl::fsck::fsck(&repo).unwrap().ok());
}
