use crate::wire::{Reader, Writer};
use crate::{Dtype, FormatError, ObjectId, ObjectKind, TensorHeader};

/// Whether a stored tensor reproduces the committed bytes exactly.
#[derive(Clone, Debug, PartialEq)]
pub enum Exactness {
    /// Checkout writes the committed bytes.
    Lossless,
    /// Checkout writes a reconstruction; the settings and the measured error are recorded.
    Lossy(Lossy),
}

/// How a lossy tensor was made and what it cost, measured on the reconstruction at commit.
#[derive(Clone, Debug, PartialEq)]
pub struct Lossy {
    /// The lossy codec's settings as `key=value` words (e.g. `quant bins=8 prune=0.2 …`).
    pub settings: String,
    /// Largest absolute difference between the reconstruction and the committed tensor.
    pub max_abs_error: f64,
    /// Relative L2 error of the reconstruction against the committed tensor.
    pub rel_error: f64,
    /// Estimated change of the training loss from this tensor's error, when the checkpoint
    /// carried its optimizer moments.
    pub est_delta_loss: Option<f64>,
}

impl Exactness {
    /// Whether this is [`Exactness::Lossy`].
    pub fn is_lossy(&self) -> bool {
        matches!(self, Exactness::Lossy(_))
    }

    /// The lossy details, if any.
    pub fn lossy(&self) -> Option<&Lossy> {
        match self {
            Exactness::Lossy(l) => Some(l),
            Exactness::Lossless => None,
        }
    }
}

/// One tensor of a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Name as in the safetensors header.
    pub name: String,
    /// Dtype and shape.
    pub header: TensorHeader,
    /// The tensor object.
    pub id: ObjectId,
    /// Lossless or lossy.
    pub exactness: Exactness,
}

/// A checkpoint's table of contents: tensors in data order, metadata and the original header.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    /// The safetensors JSON header exactly as committed, padding included.
    pub header_json: Vec<u8>,
    /// The `__metadata__` pairs, sorted by key.
    pub metadata: Vec<(String, String)>,
    /// Tensors in the order their bytes appear in the file.
    pub entries: Vec<Entry>,
}

const MANIFEST_VERSION: u16 = 1;

impl Manifest {
    /// Bytes of the tensors' data.
    pub fn data_len(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| e.header.data_len().unwrap_or(0))
            .sum()
    }

    /// Size of the safetensors file a checkout writes.
    pub fn file_len(&self) -> u64 {
        8 + self.header_json.len() as u64 + self.data_len()
    }

    /// The canonical serialisation (what the id hashes). Layout in `docs/FORMAT.md`.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u8(ObjectKind::Manifest as u8).u16(MANIFEST_VERSION);
        w.bytes(&self.header_json);
        w.u32(self.metadata.len() as u32);
        for (k, v) in &self.metadata {
            w.str(k).str(v);
        }
        w.u32(self.entries.len() as u32);
        for e in &self.entries {
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
        w.buf
    }

    /// Parses [`Self::encode`] output.
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(bytes, "manifest");
        let kind = r.u8()?;
        if kind != ObjectKind::Manifest as u8 {
            return Err(FormatError::invalid(
                "manifest",
                format!("object kind {kind}"),
            ));
        }
        let version = r.u16()?;
        if version != MANIFEST_VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: "manifest",
                found: version,
                supported: MANIFEST_VERSION,
            });
        }
        let header_json = r.bytes()?.to_vec();
        let n = r.count(8)?;
        let mut metadata = Vec::with_capacity(n);
        for _ in 0..n {
            metadata.push((r.str()?.to_string(), r.str()?.to_string()));
        }
        let n = r.count(4 + 2 + 32 + 1)?;
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
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
            entries.push(Entry {
                name,
                header,
                id,
                exactness,
            });
        }
        r.finish()?;
        Ok(Manifest {
            header_json,
            metadata,
            entries,
        })
    }

    /// The manifest's id.
    pub fn id(&self) -> ObjectId {
        ObjectId::hash(&self.encode())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Manifest {
        Manifest {
            header_json: br#"{"a":{}}  "#.to_vec(),
            metadata: vec![("k".into(), "v".into())],
            entries: vec![
                Entry {
                    name: "a".into(),
                    header: TensorHeader::new(Dtype::F32, vec![2, 3]),
                    id: ObjectId::hash(b"a"),
                    exactness: Exactness::Lossless,
                },
                Entry {
                    name: "s".into(),
                    header: TensorHeader::new(Dtype::BF16, vec![]),
                    id: ObjectId::hash(b"s"),
                    exactness: Exactness::Lossy(Lossy {
                        settings: "quant bins=8".into(),
                        max_abs_error: 0.5,
                        rel_error: 0.01,
                        est_delta_loss: Some(1e-4),
                    }),
                },
                Entry {
                    name: "t".into(),
                    header: TensorHeader::new(Dtype::F16, vec![1]),
                    id: ObjectId::hash(b"t"),
                    exactness: Exactness::Lossy(Lossy {
                        settings: "trim bits=3".into(),
                        max_abs_error: 0.0,
                        rel_error: 0.0,
                        est_delta_loss: None,
                    }),
                },
            ],
        }
    }

    #[test]
    fn round_trip_and_lengths() {
        let m = sample();
        let bytes = m.encode();
        assert_eq!(Manifest::decode(&bytes).unwrap(), m);
        assert_eq!(m.data_len(), 24 + 2 + 2);
        assert_eq!(m.file_len(), 8 + 10 + 28);
        for cut in 0..bytes.len() {
            assert!(Manifest::decode(&bytes[..cut]).is_err());
        }
    }

    proptest::proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..400)) {
            let _ = Manifest::decode(&bytes);
        }
    }
}
