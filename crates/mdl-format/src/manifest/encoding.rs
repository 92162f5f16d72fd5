//! The manifest's canonical bytes, in both layout versions (`docs/FORMAT.md`); they are read by
//! [`super::view`].
//!
//! A version 1 manifest (one safetensors file) encodes back to exactly the bytes it was read
//! from. Version 2 describes a tree of files.

use super::{Entry, Exactness, Manifest, Region};
use crate::wire::Writer;
use crate::ObjectKind;

pub(super) const CURRENT_VERSION: u16 = 2;

pub(super) const INLINE: u8 = 0;
pub(super) const BYTES: u8 = 1;
pub(super) const TENSOR: u8 = 2;

pub(super) const EXECUTABLE: u8 = 1;

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
