//! Archives built here as `torch.save` lays them out (the real `torch.save`'s files are tested
//! end to end in `tests/python`).

use super::*;

/// Pickle bytes, written opcode by opcode.
#[derive(Default)]
struct P(Vec<u8>);

impl P {
    fn op(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    fn str(self, s: &str) -> Self {
        let mut b = vec![b'X'];
        b.extend_from_slice(&(s.len() as u32).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
        self.op(&b)
    }
    fn int(self, v: u8) -> Self {
        self.op(&[b'K', v])
    }
    fn global(self, module: &str, name: &str) -> Self {
        self.op(format!("c{module}\n{name}\n").as_bytes())
    }
    /// `_rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())`.
    fn tensor(
        self,
        class: &str,
        key: &str,
        numel: u8,
        offset: u8,
        size: &[u8],
        stride: &[u8],
    ) -> Self {
        let mut p = self
            .global("torch._utils", "_rebuild_tensor_v2")
            .op(b"((")
            .str("storage")
            .global("torch", class)
            .str(key)
            .str("cpu")
            .int(numel)
            .op(b"tQ")
            .int(offset)
            .op(b"(");
        for &d in size {
            p = p.int(d);
        }
        p = p.op(b"t(");
        for &d in stride {
            p = p.int(d);
        }
        p.op(b"t\x89")
            .global("collections", "OrderedDict")
            .op(b")R")
            .op(b"tR")
    }
}

/// A zip of stored entries, each entry's bytes aligned to 64 as torch aligns them.
fn zip(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in entries {
        let at = out.len() as u32;
        let unpadded = out.len() + 30 + name.len() + 4;
        let pad = (64 - unpadded % 64) % 64;
        let mut local = Vec::new();
        local.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        local.extend_from_slice(&[0; 10]); // version, flags, method 0, time, date
        local.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
        local.extend_from_slice(&(data.len() as u32).to_le_bytes());
        local.extend_from_slice(&(data.len() as u32).to_le_bytes());
        local.extend_from_slice(&(name.len() as u16).to_le_bytes());
        local.extend_from_slice(&((4 + pad) as u16).to_le_bytes());
        local.extend_from_slice(name.as_bytes());
        local.extend_from_slice(b"FB");
        local.extend_from_slice(&(pad as u16).to_le_bytes());
        local.extend(std::iter::repeat_n(b'Z', pad));
        out.extend_from_slice(&local);
        out.extend_from_slice(data);
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&[0; 12]); // made by, needed, flags, method 0, time, date
        central.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
        central.extend_from_slice(&(data.len() as u32).to_le_bytes());
        central.extend_from_slice(&(data.len() as u32).to_le_bytes());
        central.extend_from_slice(&(name.len() as u16).to_le_bytes());
        central.extend_from_slice(&[0; 12]); // extra, comment, disk, attributes
        central.extend_from_slice(&at.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let dir_at = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&dir_at.to_le_bytes());
    out.extend_from_slice(&[0; 2]);
    out
}

/// An optimizer's state dict: `{'state': {0: {'step': t, 'exp_avg': t, 'exp_avg_sq': t}},
/// 'param_groups': [{'params': [0]}]}`, the moments 2×3 f32 and `exp_avg_sq` a transposed
/// view, plus a bf16 tensor sharing the storage of another.
fn optimizer_pickle() -> Vec<u8> {
    P::default()
        .op(b"\x80\x02}q\x00(")
        .str("state")
        .op(b"}(")
        .int(0)
        .op(b"}(")
        .str("step")
        .tensor("FloatStorage", "0", 1, 0, &[], &[])
        .str("exp_avg")
        .tensor("FloatStorage", "1", 6, 0, &[2, 3], &[3, 1])
        .str("exp_avg_sq")
        .tensor("FloatStorage", "2", 6, 0, &[3, 2], &[1, 3])
        .str("half")
        .tensor("BFloat16Storage", "3", 4, 0, &[2, 2], &[2, 1])
        .op(b"q\x01")
        .str("half_view")
        .tensor("BFloat16Storage", "3", 4, 2, &[2], &[1])
        .op(b"uuu")
        .str("param_groups")
        .op(b"](}(")
        .str("params")
        .op(b"]K\x00a")
        .str("lr")
        .op(b"G?\xb9\x99\x99\x99\x99\x99\x9a")
        .op(b"ues.")
        .0
}

fn optimizer_archive() -> Vec<u8> {
    let pkl = optimizer_pickle();
    zip(&[
        ("optimizer/data.pkl", &pkl),
        ("optimizer/byteorder", b"little"),
        ("optimizer/data/0", &[0; 4]),
        ("optimizer/data/1", &[1; 24]),
        ("optimizer/data/2", &[2; 24]),
        ("optimizer/data/3", &[3; 8]),
        ("optimizer/version", b"3\n"),
    ])
}

#[test]
fn storages_are_found_named_and_typed() {
    let file = optimizer_archive();
    let a = split(&file).unwrap();
    let got: Vec<(&str, Dtype, &[u64])> = a
        .storages
        .iter()
        .map(|s| (s.name.as_str(), s.header.dtype, s.header.shape.as_slice()))
        .collect();
    assert_eq!(
        got,
        [
            ("state.0.step", Dtype::F32, &[][..]),
            ("state.0.exp_avg", Dtype::F32, &[2, 3][..]),
            // A transposed view is not the storage's layout: stored flat.
            ("state.0.exp_avg_sq", Dtype::F32, &[6][..]),
            // Shared by two tensors: named by the first.
            ("state.0.half", Dtype::BF16, &[2, 2][..]),
        ]
    );
    for (s, fill) in a.storages.iter().zip([0u8, 1, 2, 3]) {
        let len = s.header.data_len().unwrap() as usize;
        let at = s.offset as usize;
        assert!(file[at..at + len].iter().all(|&b| b == fill), "{}", s.name);
        assert_eq!(s.offset % 64, 0);
    }
    assert_eq!(a.others.len(), 3, "data.pkl, byteorder, version");
}

#[test]
fn unsupported_and_malformed_input_is_refused() {
    // An opcode torch never writes (INST, which would name a class to instantiate).
    let mut pkl = optimizer_pickle();
    pkl.insert(2, b'i');
    let file = zip(&[("a/data.pkl", &pkl)]);
    assert!(matches!(
        split(&file),
        Err(TorchError::Opcode { op: b'i', at: 2 })
    ));
    // A zip without data.pkl, and bytes that are no zip.
    assert!(matches!(
        split(&zip(&[("a/x", b"1")])),
        Err(TorchError::NotTorch(_))
    ));
    assert!(matches!(
        split(b"not a zip at all"),
        Err(TorchError::Zip(_))
    ));
    // A storage whose bytes disagree with its element count stays bytes.
    let file = zip(&[("o/data.pkl", &optimizer_pickle()), ("o/data/1", &[1; 20])]);
    let a = split(&file).unwrap();
    assert!(a.storages.is_empty());
    // Big-endian storages are not split.
    let file = zip(&[("o/data.pkl", &optimizer_pickle()), ("o/byteorder", b"big")]);
    assert!(matches!(split(&file), Err(TorchError::NotTorch(_))));
}

#[test]
fn every_truncation_fails_cleanly() {
    let file = optimizer_archive();
    for cut in 0..file.len() {
        let _ = split(&file[..cut]);
    }
    let pkl = optimizer_pickle();
    for cut in 0..pkl.len() {
        assert!(pickle::parse(&pkl[..cut]).is_err());
    }
}

proptest::proptest! {
    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
        let _ = pickle::parse(&bytes);
        let _ = split(&bytes);
    }

    #[test]
    fn flipped_archives_never_panic(at in 0usize..2000, bit in 0u8..8) {
        let mut file = optimizer_archive();
        let at = at % file.len();
        file[at] ^= 1 << bit;
        let _ = split(&file);
    }
}

/// A float in pickle's binary form (`BINFLOAT`: big-endian).
fn float(p: P, x: f64) -> P {
    let mut b = vec![b'G'];
    b.extend_from_slice(&x.to_be_bytes());
    p.op(&b)
}

#[test]
fn adam_betas_are_read_from_param_groups_and_training_arguments() {
    // `{'param_groups': [{'lr': 0.001, 'betas': (0.9, 0.95)}, {'betas': (0.8, 0.97)}]}`
    let betas = |p: P, b1: f64, b2: f64| float(float(p.str("betas"), b1), b2).op(b"\x86s");
    let mut p = P::default().op(b"\x80\x02}").str("param_groups").op(b"](");
    p = betas(float(p.op(b"}").str("lr"), 0.001).op(b"s"), 0.9, 0.95);
    p = betas(p.op(b"}"), 0.8, 0.97).op(b"es.");
    let file = zip(&[("a/data.pkl", &p.0), ("a/byteorder", b"little")]);
    assert_eq!(adam_betas(&file).unwrap(), Some((0.9, 0.97)));

    // A dataclass as `torch.save(TrainingArguments)` pickles it: the fields are its state.
    let p = P::default()
        .op(b"\x80\x02")
        .global("transformers.training_args", "TrainingArguments")
        .op(b")\x81}(")
        .str("adam_beta1");
    let p = float(float(p, 0.85).str("adam_beta2"), 0.98).op(b"ub.");
    let file = zip(&[("b/data.pkl", &p.0)]);
    assert_eq!(adam_betas(&file).unwrap(), Some((0.85, 0.98)));

    // Nothing recorded, or values that are not betas.
    let p = float(P::default().op(b"\x80\x02}").str("betas"), 1.5).op(b"s.");
    assert_eq!(adam_betas(&zip(&[("c/data.pkl", &p.0)])).unwrap(), None);
    assert!(adam_betas(b"not a zip").is_err());
}
