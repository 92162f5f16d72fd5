//! The manifest's canonical bytes, in both layout versions (`docs/FORMAT.md`).
//!
//! Version 1 described one safetensors file (its header, metadata and tensors); it is read as a
//! tree of that one file, [`V1_FILE_PATH`], whose first region is the header, and encodes back
//! to exactly the bytes it was read from. Version 2 describes a tree of files.

use super::{
    Entry, Exactness, FileFormat, Lossy, Manifest, MomentPair, PairSource, Region, TreeFile,
    V1_FILE_PATH,
};
use crate::wire::{Reader, Writer};
use crate::{Dtype, FormatError, ObjectKind, TensorHeader};

pub(super) const CURRENT_VERSION: u16 = 2;

const INLINE: u8 = 0;
const BYTES: u8 = 1;
const TENSOR: u8 = 2;

const EXECUTABLE: u8 = 1;

pub(super) fn encode(m: &Manifest) -> Vec<u8> {
    let mut w = Writer::default();
    w.u8(ObjectKind::Manifest as u8).u16(m.version);
    if m.version == 1 {
        encode_v1(m, &mut w);
        return w.buf;
    }
    w.u32(m.files.len() as u32);
    for f in &m.files {
        w.str(&f.path)
            .u8(f.format as u8)
            .u8(if f.executable { EXECUTABLE } else { 0 })
            .str(&f.note);
        metadata(&mut w, &f.metadata);
        w.u32(f.regions.len() as u32);
        for r in &f.regions {
            match r {
                Region::Inline(b) => {
                    w.u8(INLINE).bytes(b);
                }
                Region::Bytes { id, len } => {
                    w.u8(BYTES).u64(*len).id(id);
                }
                Region::Tensor(e) => {
                    w.u8(TENSOR);
                    entry(&mut w, e);
                }
            }
        }
    }
    w.u32(m.pairs.len() as u32);
    for p in &m.pairs {
        w.u32(p.param)
            .u32(p.exp_avg)
            .u32(p.exp_avg_sq)
            .u8(p.source as u8);
    }
    w.buf
}

/// A version 1 manifest is only ever made by [`decode`], in the shape it gives.
fn encode_v1(m: &Manifest, w: &mut Writer) {
    let file = match m.files.as_slice() {
        [f] => f,
        _ => panic!("a version 1 manifest holds exactly one file"),
    };
    let Some(Region::Inline(head)) = file.regions.first() else {
        panic!("a version 1 manifest's file starts with its header");
    };
    w.bytes(&head[8..]);
    metadata(w, &file.metadata);
    w.u32(file.regions.len() as u32 - 1);
    for r in &file.regions[1..] {
        let Region::Tensor(e) = r else {
            panic!("a version 1 manifest holds only tensors after its header");
        };
        entry(w, e);
    }
}

fn metadata(w: &mut Writer, pairs: &[(String, String)]) {
    w.u32(pairs.len() as u32);
    for (k, v) in pairs {
        w.str(k).str(v);
    }
}

fn entry(w: &mut Writer, e: &Entry) {
    w.str(&e.name)
        .u8(e.header.dtype as u8)
        .u8(e.header.shape.len() as u8);
    for &d in &e.header.shape {
        w.u64(d);
    }
    w.id(&e.id);
    match &e.exactness {
        Exactness::Lossless => {
            w.u8(0);
        }
        Exactness::Lossy(l) => {
            w.u8(2)
                .str(&l.settings)
                .f64(l.max_abs_error)
                .f64(l.rel_error);
            match l.est_delta_loss {
                Some(d) => w.u8(1).f64(d),
                None => w.u8(0),
            };
        }
    }
}

pub(super) fn decode(bytes: &[u8]) -> Result<Manifest, FormatError> {
    let mut r = Reader::new(bytes, "manifest");
    let kind = r.u8()?;
    if kind != ObjectKind::Manifest as u8 {
        return Err(FormatError::invalid(
            "manifest",
            format!("object kind {kind}"),
        ));
    }
    let version = r.u16()?;
    let m = match version {
        1 => decode_v1(&mut r)?,
        2 => decode_v2(&mut r)?,
        found => {
            return Err(FormatError::UnsupportedVersion {
                what: "manifest",
                found,
                supported: CURRENT_VERSION,
            })
        }
    };
    r.finish()?;
    Ok(m)
}

fn decode_v1(r: &mut Reader<'_>) -> Result<Manifest, FormatError> {
    let header_json = r.bytes()?;
    let mut head = (header_json.len() as u64).to_le_bytes().to_vec();
    head.extend_from_slice(header_json);
    let metadata = read_metadata(r)?;
    let n = r.count(4 + 2 + 32 + 1)?;
    let mut regions = Vec::with_capacity(n + 1);
    regions.push(Region::Inline(head));
    for _ in 0..n {
        regions.push(Region::Tensor(read_entry(r)?));
    }
    Ok(Manifest {
        files: vec![TreeFile {
            path: V1_FILE_PATH.into(),
            format: FileFormat::Safetensors,
            executable: false,
            note: String::new(),
            metadata,
            regions,
        }],
        pairs: Vec::new(),
        version: 1,
    })
}

fn decode_v2(r: &mut Reader<'_>) -> Result<Manifest, FormatError> {
    let n = r.count(4 + 1 + 1 + 4 + 4 + 4)?;
    let mut files = Vec::with_capacity(n);
    for _ in 0..n {
        let path = r.str()?.to_string();
        let format = FileFormat::try_from(r.u8()?)?;
        let flags = r.u8()?;
        if flags & !EXECUTABLE != 0 {
            return Err(FormatError::invalid(
                "manifest",
                format!("{path:?}: unknown flags {flags:#x}"),
            ));
        }
        let note = r.str()?.to_string();
        let metadata = read_metadata(r)?;
        let n = r.count(1 + 4)?;
        let mut regions = Vec::with_capacity(n);
        for _ in 0..n {
            regions.push(match r.u8()? {
                INLINE => Region::Inline(r.bytes()?.to_vec()),
                BYTES => Region::Bytes {
                    len: r.u64()?,
                    id: r.id()?,
                },
                TENSOR => Region::Tensor(read_entry(r)?),
                tag => {
                    return Err(FormatError::UnknownTag {
                        what: "region",
                        tag,
                    })
                }
            });
        }
        files.push(TreeFile {
            path,
            format,
            executable: flags & EXECUTABLE != 0,
            note,
            metadata,
            regions,
        });
    }
    let n = r.count(13)?;
    let mut pairs = Vec::with_capacity(n);
    for _ in 0..n {
        pairs.push(MomentPair {
            param: r.u32()?,
            exp_avg: r.u32()?,
            exp_avg_sq: r.u32()?,
            source: match r.u8()? {
                0 => PairSource::Names,
                1 => PairSource::OptimizerOrder,
                2 => PairSource::Client,
                tag => {
                    return Err(FormatError::UnknownTag {
                        what: "pair source",
                        tag,
                    })
                }
            },
        });
    }
    Ok(Manifest {
        files,
        pairs,
        version: 2,
    })
}

fn read_metadata(r: &mut Reader<'_>) -> Result<Vec<(String, String)>, FormatError> {
    let n = r.count(8)?;
    let mut metadata = Vec::with_capacity(n);
    for _ in 0..n {
        metadata.push((r.str()?.to_string(), r.str()?.to_string()));
    }
    Ok(metadata)
}

fn read_entry(r: &mut Reader<'_>) -> Result<Entry, FormatError> {
    let name = r.str()?.to_string();
    let dtype = Dtype::try_from(r.u8()?)?;
    let rank = r.u8()? as usize;
    if rank > TensorHeader::MAX_RANK {
        return Err(FormatError::invalid("manifest", format!("rank {rank}")));
    }
    let shape = (0..rank).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
    let header = TensorHeader::new(dtype, shape);
    if header.data_len().is_none() {
        return Err(FormatError::invalid(
            "manifest",
            format!("{name:?} size overflows"),
        ));
    }
    let id = r.id()?;
    let exactness = match r.u8()? {
        0 => Exactness::Lossless,
        // Tag 1 (settings and relative error only) was never written by a release.
        2 => Exactness::Lossy(Lossy {
            settings: r.str()?.to_string(),
            max_abs_error: r.f64()?,
            rel_error: r.f64()?,
            est_delta_loss: match r.u8()? {
                0 => None,
                1 => Some(r.f64()?),
                tag => {
                    return Err(FormatError::UnknownTag {
                        what: "loss estimate",
                        tag,
                    })
                }
            },
        }),
        tag => {
            return Err(FormatError::UnknownTag {
                what: "exactness",
                tag,
            })
        }
    };
    Ok(Entry {
        name,
        header,
        id,
        exactness,
    })
}
