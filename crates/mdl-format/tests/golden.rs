//! Known answers for the bytes that identity rests on. Each expected serialisation is spelled
//! out here byte by byte from `docs/FORMAT.md`, not produced by the code under test, and each
//! id is pinned as hex: if an encoder, the hash or the layout changes, every id in every
//! repository would change with it, and these tests say so first. A deliberate format change
//! bumps `FORMAT_VERSION`, adds a fixture under `tests/fixtures/` and adds vectors here; the
//! old vectors keep decoding.

use mdl_format::record::{self, RecordHeader};
use mdl_format::{
    Commit, CommitStats, Dtype, Entry, Exactness, FileFormat, Lossy, Manifest, MomentPair,
    ObjectId, ObjectKind, PairSource, Region, TensorHeader, Timestamp, TreeFile, FORMAT_VERSION,
    V1_FILE_PATH,
};

/// Bytes in the layout notation of `docs/FORMAT.md`.
#[derive(Default)]
struct Spell(Vec<u8>);

impl Spell {
    fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    fn u16(mut self, v: u16) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn i64(self, v: i64) -> Self {
        self.u64(v as u64)
    }
    fn f64(self, v: f64) -> Self {
        self.u64(v.to_bits())
    }
    fn raw(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    /// `str` / `bytes`: a u32 length, then the bytes.
    fn str(self, s: impl AsRef<[u8]>) -> Self {
        let s = s.as_ref();
        self.u32(s.len() as u32).raw(s)
    }
    fn id(self, id: &ObjectId) -> Self {
        self.raw(id.as_bytes())
    }
}

fn id(hex: &str) -> ObjectId {
    hex.parse().unwrap()
}

#[test]
fn the_hash_is_blake3() {
    // The reference vector of the BLAKE3 specification for the empty input.
    assert_eq!(
        ObjectId::hash(b"").to_hex(),
        "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    );
}

#[test]
fn a_tensor_header_and_its_id() {
    let header = TensorHeader::new(Dtype::BF16, vec![2, 3]);
    let canonical = Spell::default().u8(1).u8(9).u8(2).u64(2).u64(3).0;
    assert_eq!(header.canonical(), canonical);
    assert_eq!(TensorHeader::from_canonical(&canonical).unwrap(), header);

    let data: Vec<u8> = (0u8..12).collect();
    let id = header.object_id(&data);
    assert_eq!(id, ObjectId::hash(&[canonical, data].concat()));
    assert_eq!(
        id.to_hex(),
        "a8e99117bc538979f271c894b550ee75cae6621d4ed33fc787cf57961d0bfd03"
    );

    // A scalar (rank 0) and every dtype tag, which are never reused.
    let scalar = TensorHeader::new(Dtype::I64, vec![]);
    assert_eq!(scalar.canonical(), [1, 14, 0]);
    let tags = [
        (Dtype::Bool, 1),
        (Dtype::U8, 2),
        (Dtype::I8, 3),
        (Dtype::F8E5M2, 4),
        (Dtype::F8E4M3, 5),
        (Dtype::I16, 6),
        (Dtype::U16, 7),
        (Dtype::F16, 8),
        (Dtype::BF16, 9),
        (Dtype::I32, 10),
        (Dtype::U32, 11),
        (Dtype::F32, 12),
        (Dtype::F64, 13),
        (Dtype::I64, 14),
        (Dtype::U64, 15),
        (Dtype::F8E8M0, 16),
        (Dtype::C64, 17),
    ];
    for (dtype, tag) in tags {
        assert_eq!(
            TensorHeader::new(dtype, vec![1]).canonical()[1],
            tag,
            "{dtype:?}"
        );
    }
}

const HEADER_JSON: &[u8] = br#"{"__metadata__":{"step":"7"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]}}  "#;

/// The version 1 manifest of a safetensors file with tensors `a` (lossless) and `b` (lossy).
fn manifest_v1_bytes() -> Vec<u8> {
    Spell::default()
        .u8(2)
        .u16(1)
        .str(HEADER_JSON)
        .u32(1)
        .str("step")
        .str("7")
        .u32(2)
        // a: lossless f32 [2]
        .str("a")
        .u8(12)
        .u8(1)
        .u64(2)
        .id(&id(
            "0101010101010101010101010101010101010101010101010101010101010101",
        ))
        .u8(0)
        // b: lossy bf16 [2, 2]
        .str("b")
        .u8(9)
        .u8(2)
        .u64(2)
        .u64(2)
        .id(&id(
            "0202020202020202020202020202020202020202020202020202020202020202",
        ))
        .u8(2)
        .str("quant bins=4 prune=0 protect=0.0005 metric=magnitude")
        .f64(0.25)
        .f64(0.0625)
        .u8(1)
        .f64(-1.5)
        .0
}

fn entry_a() -> Entry {
    Entry {
        name: "a".into(),
        header: TensorHeader::new(Dtype::F32, vec![2]),
        id: id("0101010101010101010101010101010101010101010101010101010101010101"),
        exactness: Exactness::Lossless,
    }
}

fn entry_b() -> Entry {
    Entry {
        name: "b".into(),
        header: TensorHeader::new(Dtype::BF16, vec![2, 2]),
        id: id("0202020202020202020202020202020202020202020202020202020202020202"),
        exactness: Exactness::Lossy(Lossy {
            settings: "quant bins=4 prune=0 protect=0.0005 metric=magnitude".into(),
            max_abs_error: 0.25,
            rel_error: 0.0625,
            est_delta_loss: Some(-1.5),
        }),
    }
}

#[test]
fn a_version_1_manifest_and_its_id() {
    let spelled = manifest_v1_bytes();
    let m = Manifest::decode(&spelled).unwrap();
    assert_eq!(m.version(), 1);
    // One safetensors file: its header (length and JSON) inline, then the tensors.
    let [file] = m.files.as_slice() else {
        panic!("one file")
    };
    assert_eq!(file.path, V1_FILE_PATH);
    assert_eq!(file.format, FileFormat::Safetensors);
    assert_eq!(file.metadata, [("step".to_string(), "7".to_string())]);
    let mut head = (HEADER_JSON.len() as u64).to_le_bytes().to_vec();
    head.extend_from_slice(HEADER_JSON);
    assert_eq!(
        file.regions,
        [
            Region::Inline(head),
            Region::Tensor(entry_a()),
            Region::Tensor(entry_b())
        ]
    );
    // It encodes back to exactly its bytes, so its id never changes.
    assert_eq!(m.encode(), spelled);
    assert_eq!(
        m.id().to_hex(),
        "77ae901fd81d7957fff851ff130297b2dfa2f1e7b64b8116bf966c3ceb04c700"
    );
}

/// A version 2 tree: a safetensors file, an executable script stored as a bytes object, a
/// torch archive stored as bytes with a note, and one moment pair.
fn manifest_v2() -> Manifest {
    let mut st_head = (HEADER_JSON.len() as u64).to_le_bytes().to_vec();
    st_head.extend_from_slice(HEADER_JSON);
    let files = vec![
        TreeFile {
            path: "ck/model.safetensors".into(),
            format: FileFormat::Safetensors,
            executable: false,
            note: String::new(),
            metadata: vec![("step".into(), "7".into())],
            regions: vec![
                Region::Inline(st_head),
                Region::Tensor(entry_a()),
                Region::Tensor(entry_b()),
            ],
        },
        TreeFile {
            path: "run.sh".into(),
            format: FileFormat::Bytes,
            executable: true,
            note: String::new(),
            metadata: vec![],
            regions: vec![Region::Bytes {
                id: id("0404040404040404040404040404040404040404040404040404040404040404"),
                len: 5000,
            }],
        },
        TreeFile {
            path: "ck/old.pt".into(),
            format: FileFormat::Bytes,
            executable: false,
            note: "not split".into(),
            metadata: vec![],
            regions: vec![Region::Inline(b"PK".to_vec())],
        },
    ];
    let pairs = vec![MomentPair {
        param: 0,
        exp_avg: 1,
        exp_avg_sq: 1,
        source: PairSource::OptimizerOrder,
    }];
    Manifest::new(files, pairs).unwrap()
}

#[test]
fn a_version_2_manifest_and_its_id() {
    let m = manifest_v2();
    let mut st_head = (HEADER_JSON.len() as u64).to_le_bytes().to_vec();
    st_head.extend_from_slice(HEADER_JSON);
    let spelled = Spell::default()
        .u8(2)
        .u16(2)
        .u32(3)
        // Files sorted by path.
        .str("ck/model.safetensors")
        .u8(1) // safetensors
        .u8(0) // flags
        .str("") // note
        .u32(1)
        .str("step")
        .str("7")
        .u32(3)
        .u8(0) // inline
        .str(&st_head)
        .u8(2) // tensor a
        .str("a")
        .u8(12)
        .u8(1)
        .u64(2)
        .id(&entry_a().id)
        .u8(0)
        .u8(2) // tensor b
        .str("b")
        .u8(9)
        .u8(2)
        .u64(2)
        .u64(2)
        .id(&entry_b().id)
        .u8(2)
        .str("quant bins=4 prune=0 protect=0.0005 metric=magnitude")
        .f64(0.25)
        .f64(0.0625)
        .u8(1)
        .f64(-1.5)
        .str("ck/old.pt")
        .u8(0) // bytes
        .u8(0)
        .str("not split")
        .u32(0)
        .u32(1)
        .u8(0)
        .str("PK")
        .str("run.sh")
        .u8(0)
        .u8(1) // executable
        .str("")
        .u32(0)
        .u32(1)
        .u8(1) // bytes object
        .u64(5000)
        .id(&id(
            "0404040404040404040404040404040404040404040404040404040404040404",
        ))
        .u32(1) // one pair
        .u32(0)
        .u32(1)
        .u32(1)
        .u8(1)
        .0;
    assert_eq!(m.encode(), spelled);
    assert_eq!(Manifest::decode(&spelled).unwrap(), m);
    assert_eq!(m.id(), ObjectId::hash(&spelled));
    assert_eq!(
        m.id().to_hex(),
        "30140e31f4fa6e07ea988ac02fa27de9f40c0f2d744d47ea8e5fd847ad7dd01e"
    );
}

fn commit() -> Commit {
    Commit {
        manifest: id("0303030303030303030303030303030303030303030303030303030303030303"),
        parents: vec![id(
            "0404040404040404040404040404040404040404040404040404040404040404",
        )],
        author: "ada".into(),
        time: Timestamp(1_763_700_000_123),
        message: "step 7".into(),
        step: Some(7),
        metrics: vec![("acc".into(), 0.5), ("loss".into(), 2.25)],
        stats: CommitStats {
            raw_bytes: 1000,
            stored_bytes: 600,
            tensors: 2,
            new_tensors: 1,
            lossy_tensors: 1,
        },
        properties: Vec::new(),
    }
}

#[test]
fn a_commit_and_its_id() {
    let c = commit();
    let spelled = Spell::default()
        .u8(3)
        .u16(2)
        .id(&c.manifest)
        .u32(1)
        .id(&c.parents[0])
        .str("ada")
        .i64(1_763_700_000_123)
        .str("step 7")
        .u8(1)
        .u64(7)
        .u32(2)
        .str("acc")
        .f64(0.5)
        .str("loss")
        .f64(2.25)
        .u64(1000)
        .u64(600)
        .u32(2)
        .u32(1)
        .u32(1)
        .0;
    assert_eq!(c.encode(), spelled);
    assert_eq!(Commit::decode(&spelled).unwrap(), c);
    assert_eq!(c.id(), ObjectId::hash(&spelled));
    assert_eq!(
        c.id().to_hex(),
        "954bb590f3666bebe616464afec17c7d7123cd742e350d6ff48062e61471e981"
    );

    // Version 1 commits (before lossy_tensors) still read, as having none.
    let mut v1 = spelled.clone();
    v1[1..3].copy_from_slice(&1u16.to_le_bytes());
    v1.truncate(v1.len() - 4);
    let old = Commit::decode(&v1).unwrap();
    assert_eq!(old.stats.lossy_tensors, 0);
    assert_eq!(old.stats.new_tensors, 1);
}

/// A commit with properties is version 3: the version 2 layout, then the properties sorted by
/// name. (Without properties it stays version 2, byte for byte: the test above.)
#[test]
fn a_commit_with_properties_is_version_3() {
    let mut c = commit();
    c.properties = vec![
        ("merge.strategy".into(), "linear".into()),
        ("source.git".into(), "0a1b".into()),
    ];
    let mut spelled = c.clone();
    spelled.properties.clear();
    let mut spelled = spelled.encode();
    spelled[1..3].copy_from_slice(&3u16.to_le_bytes());
    spelled.extend(
        Spell::default()
            .u32(2)
            .str("merge.strategy")
            .str("linear")
            .str("source.git")
            .str("0a1b")
            .0,
    );
    assert_eq!(c.encode(), spelled);
    assert_eq!(Commit::decode(&spelled).unwrap(), c);
}

#[test]
fn a_record_byte_for_byte() {
    let base = id("0505050505050505050505050505050505050505050505050505050505050505");
    let prefix = TensorHeader::new(Dtype::F32, vec![3]).canonical();
    let header = RecordHeader::new(ObjectKind::Tensor, 3, Some(base), prefix.clone());
    let payload = [9u8, 8, 7, 6, 5];
    let bytes = record::encode(&header, &payload, 12);

    let front = Spell::default()
        .raw(b"MDLR")
        .u16(FORMAT_VERSION)
        .u8(1) // kind: tensor
        .u8(3) // codec: xor-delta
        .u8(1) // flags: has base
        .id(&base)
        .u16(prefix.len() as u16)
        .raw(&prefix)
        .raw(&payload)
        .u64(12)
        .u64(payload.len() as u64)
        .0;
    let crc = crc32(&front);
    let spelled = Spell(front).u32(crc).0;
    assert_eq!(bytes, spelled);
    assert_eq!(crc, GOLDEN_RECORD_CRC);

    let (read, body, trailer) = record::decode(&spelled).unwrap();
    assert_eq!(read, header);
    assert_eq!(body, payload);
    assert_eq!(trailer.content_len, 12);

    // A record of the first version, without a base, still reads.
    let old = RecordHeader {
        version: 1,
        kind: ObjectKind::Manifest,
        codec: 1,
        base: None,
        prefix: Vec::new(),
        coarsened: None,
    };
    let front = Spell::default()
        .raw(b"MDLR")
        .u16(1)
        .u8(2)
        .u8(1)
        .u8(0)
        .u16(0)
        .raw(&payload)
        .u64(40)
        .u64(5)
        .0;
    let crc = crc32(&front);
    let spelled = Spell(front).u32(crc).0;
    assert_eq!(record::encode(&old, &payload, 40), spelled);
    assert_eq!(record::decode(&spelled).unwrap().0, old);

    // A coarsened record: flag bit 1, after the base its content's id and the added errors.
    let content = id("0606060606060606060606060606060606060606060606060606060606060606");
    let mut coarse = RecordHeader::new(ObjectKind::Tensor, 8, Some(base), prefix.clone());
    coarse.coarsened = Some(record::Coarsened {
        content,
        max_abs_error: 0.5,
        rel_error: 0.125,
    });
    let front = Spell::default()
        .raw(b"MDLR")
        .u16(FORMAT_VERSION)
        .u8(1)
        .u8(8) // codec: quant-residual
        .u8(3) // flags: has base, coarsened
        .id(&base)
        .id(&content)
        .u64(0.5f64.to_bits())
        .u64(0.125f64.to_bits())
        .u16(prefix.len() as u16)
        .raw(&prefix)
        .raw(&payload)
        .u64(12)
        .u64(payload.len() as u64)
        .0;
    let crc = crc32(&front);
    let spelled = Spell(front).u32(crc).0;
    assert_eq!(record::encode(&coarse, &payload, 12), spelled);
    assert_eq!(record::decode(&spelled).unwrap().0, coarse);
}

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320), written out bit by bit.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn the_crc_is_crc32_ieee() {
    // The check value of CRC-32/ISO-HDLC.
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
}
/// The checksum of the record spelled in [`a_record_byte_for_byte`] (format version 14; it was
/// 89,489,520 for version 13, 3,748,421,272 for version 12, 3,025,292,483 for version 11, 1,852,543,531 for version 10, 3,679,516,498 for version 9, 23,669,178 for version 8, 221,041,636 for version 7, 3,608,481,036 for versions 5 and 6 and
/// 3,088,561,821 for version 4).
const GOLDEN_RECORD_CRC: u32 = 2_960_057_609;
