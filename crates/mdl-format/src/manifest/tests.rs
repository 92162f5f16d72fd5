use super::*;

fn entry(name: &str, dtype: Dtype, shape: Vec<u64>, lossy: bool) -> Entry {
    Entry {
        name: name.into(),
        header: TensorHeader::new(dtype, shape),
        id: ObjectId::hash(name.as_bytes()),
        exactness: if lossy {
            Exactness::Lossy(Lossy {
                settings: "quant bins=8".into(),
                max_abs_error: 0.5,
                rel_error: 0.01,
                est_delta_loss: Some(1e-4),
            })
        } else {
            Exactness::Lossless
        },
    }
}

fn file(path: &str, format: FileFormat, regions: Vec<Region>) -> TreeFile {
    TreeFile {
        path: path.into(),
        format,
        executable: false,
        note: String::new(),
        metadata: Vec::new(),
        regions,
    }
}

pub(crate) fn sample() -> Manifest {
    let mut st = file(
        "model.safetensors",
        FileFormat::Safetensors,
        vec![
            Region::Inline(b"\x08\0\0\0\0\0\0\0{}      ".to_vec()),
            Region::Tensor(entry("a", Dtype::F32, vec![2, 3], false)),
            Region::Tensor(entry("s", Dtype::BF16, vec![], true)),
        ],
    );
    st.metadata = vec![("k".into(), "v".into())];
    let mut run = file(
        "run.sh",
        FileFormat::Bytes,
        vec![Region::Bytes {
            id: ObjectId::hash(b"run"),
            len: 5000,
        }],
    );
    run.executable = true;
    let mut pt = file(
        "opt/optimizer.pt",
        FileFormat::Torch,
        vec![
            Region::Inline(b"PK".to_vec()),
            Region::Tensor(entry("state.0.exp_avg", Dtype::F32, vec![2, 3], false)),
            Region::Tensor(entry("state.0.exp_avg_sq", Dtype::F32, vec![2, 3], false)),
        ],
    );
    pt.note = String::new();
    let pairs = vec![MomentPair {
        param: 0,
        exp_avg: 1,
        exp_avg_sq: 2,
        source: PairSource::OptimizerOrder,
    }];
    Manifest::new(
        vec![st, run, pt, file("empty", FileFormat::Bytes, vec![])],
        pairs,
    )
    .unwrap()
}

#[test]
fn round_trip_and_lengths() {
    let m = sample();
    assert_eq!(
        m.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
        ["empty", "model.safetensors", "opt/optimizer.pt", "run.sh"],
        "sorted by path"
    );
    let bytes = m.encode();
    assert_eq!(Manifest::decode(&bytes).unwrap(), m);
    assert_eq!(m.file("model.safetensors").unwrap().len(), 16 + 24 + 2);
    assert_eq!(m.file("run.sh").unwrap().len(), 5000);
    assert_eq!(m.len(), 42 + 5000 + 2 + 48);
    let names: Vec<_> = m.tensors().map(|(f, e)| (f, e.name.as_str())).collect();
    assert_eq!(
        names,
        [
            (1, "a"),
            (1, "s"),
            (2, "state.0.exp_avg"),
            (2, "state.0.exp_avg_sq")
        ]
    );
    assert_eq!(m.objects().count(), 5);
    for cut in 0..bytes.len() {
        assert!(Manifest::decode(&bytes[..cut]).is_err());
    }
}

#[test]
fn rejects_paths_a_checkout_could_not_write_safely() {
    let one = |path: &str| file(path, FileFormat::Bytes, vec![]);
    for bad in [
        vec![one("../x")],
        vec![one("/etc/passwd")],
        vec![one("a/.mdl/meta.redb")],
        vec![one("a"), one("a")],
        vec![one("a"), one("a/b")],
        vec![one("a/b/c"), one("a b"), one("a/b")],
    ] {
        assert!(Manifest::new(bad.clone(), vec![]).is_err(), "{bad:?}");
    }
    assert!(Manifest::new(vec![one("a/b"), one("a b"), one("ab")], vec![]).is_ok());
    let pair = MomentPair {
        param: 0,
        exp_avg: 1,
        exp_avg_sq: 9,
        source: PairSource::Names,
    };
    assert!(Manifest::new(sample().files, vec![pair]).is_err());
    // The same checks on decode: a manifest received from elsewhere is checked too.
    let mut m = sample();
    m.files[0].path = "../escape".into();
    assert!(Manifest::decode(&m.encode()).is_err());
}

#[test]
fn version_1_reads_as_one_file_and_encodes_back() {
    let mut w = crate::wire::Writer::default();
    w.u8(2).u16(1).bytes(b"{}      ").u32(0).u32(1);
    w.str("a").u8(Dtype::F32 as u8).u8(1).u64(2);
    w.id(&ObjectId::hash(b"a")).u8(0);
    let bytes = w.buf;
    let m = Manifest::decode(&bytes).unwrap();
    assert_eq!(m.version(), 1);
    assert_eq!(m.files.len(), 1);
    assert_eq!(m.files[0].path, V1_FILE_PATH);
    assert_eq!(m.files[0].len(), 16 + 8);
    assert_eq!(m.encode(), bytes);
    view_agrees(&bytes);
}

/// Everything a view says of `bytes`, against the decoded manifest: the view is walked the
/// way a server's listing walks it.
fn view_agrees(bytes: &[u8]) {
    let m = Manifest::decode(bytes).unwrap();
    let v = ManifestView::parse(bytes).unwrap();
    assert_eq!(v.version(), m.version());
    assert_eq!(v.len(), m.len());
    assert_eq!(v.files().len(), m.files.len());
    assert_eq!(v.tensor_count(), m.tensors().count() as u64);
    assert_eq!(v.pairs().collect::<Vec<_>>(), m.pairs);
    for (fv, f) in v.files().iter().zip(&m.files) {
        // By their Debug text: a NaN error recorded is not equal to itself.
        assert_eq!(format!("{:?}", fv.to_file()), format!("{f:?}"));
        assert_eq!((fv.path, fv.len()), (f.path.as_str(), f.len()));
        assert_eq!(v.file(fv.path).unwrap().path, f.path);
        assert_eq!(fv.tensor_count() as usize, f.tensors().count());
        let tensor_bytes: u64 = f.tensors().map(|e| e.header.data_len().unwrap()).sum();
        assert_eq!(fv.tensor_bytes(), tensor_bytes);
        for (ev, e) in fv.tensors().zip(f.tensors()) {
            assert_eq!(ev.name, e.name);
            assert_eq!(ev.header(), e.header);
            assert_eq!(ev.data_len(), e.header.data_len().unwrap());
            assert_eq!(ev.id(), e.id);
            assert_eq!(
                format!("{:?}", ev.exactness()),
                format!("{:?}", e.exactness)
            );
            assert_eq!(ev.is_lossy(), e.exactness.is_lossy());
        }
        let lens: Vec<u64> = fv.regions().map(|r| r.len()).collect();
        assert_eq!(lens, f.regions.iter().map(Region::len).collect::<Vec<_>>());
    }
    assert!(v.file("no such file").is_none());
}

#[test]
fn a_view_reads_what_decoding_reads() {
    let m = sample();
    view_agrees(&m.encode());
    let v = ManifestView::parse(&m.encode()).unwrap().to_manifest();
    assert_eq!(v, m);
    // Two files whose regions are the same compare equal region by region.
    let bytes = m.encode();
    let v = ManifestView::parse(&bytes).unwrap();
    let f = v.file("model.safetensors").unwrap();
    assert!(f.regions().eq(f.regions()));
    assert!(!f
        .regions()
        .eq(v.file("opt/optimizer.pt").unwrap().regions()));
}

proptest::proptest! {
    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..400)) {
        let _ = Manifest::decode(&bytes);
    }

    /// A manifest cut or with one byte changed is refused or read whole: a view it made is
    /// walked in full without a panic.
    #[test]
    fn damaged_manifests_are_refused_or_read_whole(at in 0usize..400, to in proptest::num::u8::ANY) {
        let mut bytes = sample().encode();
        let at = at % bytes.len();
        bytes[at] = to;
        for cut in [bytes.len(), at] {
            if ManifestView::parse(&bytes[..cut]).is_ok() {
                view_agrees(&bytes[..cut]);
            }
        }
    }
}
