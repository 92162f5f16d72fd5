//! Strict validation of safetensors headers.
//!
//! A safetensors file is an 8-byte little-endian header length `N`, `N` bytes of UTF-8 JSON, and
//! the tensor data. mdl keeps the header bytes verbatim (so a checkout is byte-identical) and
//! validates everything before a single byte is stored: sane length, UTF-8, JSON object, unique
//! names, known dtypes, offsets that match `shape × dtype size` and tile the data region exactly.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::Value;

use crate::{Dtype, TensorHeader};

/// Largest header accepted, in bytes (as in the reference implementation).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Why a file is not an acceptable safetensors file. Each message is one line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum SafetensorsError {
    #[error("file is {len} bytes, too short for the 8-byte header length")]
    TooShort { len: u64 },
    #[error("header length {len} exceeds the limit of {MAX_HEADER_LEN} bytes")]
    HeaderTooLarge { len: u64 },
    #[error("header length {len} runs past the end of the {file_len}-byte file (truncated?)")]
    HeaderOutOfBounds { len: u64, file_len: u64 },
    #[error("header is not valid UTF-8")]
    NotUtf8,
    #[error("header is not valid JSON: {0}")]
    Json(String),
    #[error("duplicate tensor name {0:?}")]
    DuplicateName(String),
    #[error("tensor {name:?}: unknown dtype {dtype:?}")]
    UnknownDtype { name: String, dtype: String },
    #[error("tensor {name:?}: {detail}")]
    BadEntry { name: String, detail: String },
    #[error("tensor {name:?}: data_offsets span {span} bytes but shape {shape:?} of {dtype} needs {needed}")]
    SizeMismatch {
        name: String,
        span: u64,
        shape: Vec<u64>,
        dtype: Dtype,
        needed: u64,
    },
    #[error("tensors {a:?} and {b:?} overlap")]
    Overlap { a: String, b: String },
    #[error("{gap} unused bytes before tensor {name:?} (offsets must be contiguous)")]
    Gap { name: String, gap: u64 },
    #[error(
        "tensor data ends at byte {end} but the data region has {len} bytes (truncated file?)"
    )]
    OutOfBounds { end: u64, len: u64 },
    #[error("{extra} bytes after the last tensor")]
    TrailingBytes { extra: u64 },
    #[error("__metadata__ {0}")]
    Metadata(String),
}

/// One tensor as laid out in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name (the JSON key).
    pub name: String,
    /// Dtype and shape.
    pub header: TensorHeader,
    /// Start of the tensor's bytes, relative to the start of the data region.
    pub offset: u64,
    /// Length of the tensor's bytes.
    pub len: u64,
}

/// A validated safetensors file layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Length of the JSON header in bytes (the value of the 8-byte prefix).
    pub header_len: u64,
    /// The `__metadata__` map, in file order.
    pub metadata: Vec<(String, String)>,
    /// Tensors in data order (by offset; ties, which only empty tensors can have, in header order).
    pub tensors: Vec<TensorInfo>,
}

impl Layout {
    /// Offset of the data region in the file.
    pub fn data_start(&self) -> u64 {
        8 + self.header_len
    }
}

/// Reads the header length from the first 8 bytes and checks it against the file length.
pub fn header_len(prefix: &[u8], file_len: u64) -> Result<u64, SafetensorsError> {
    if file_len < 8 || prefix.len() < 8 {
        return Err(SafetensorsError::TooShort { len: file_len });
    }
    let len = u64::from_le_bytes(prefix[..8].try_into().unwrap());
    if len > MAX_HEADER_LEN {
        return Err(SafetensorsError::HeaderTooLarge { len });
    }
    if 8 + len > file_len {
        return Err(SafetensorsError::HeaderOutOfBounds { len, file_len });
    }
    Ok(len)
}

/// Validates a header (the JSON bytes) for a file of `file_len` bytes.
pub fn parse(header: &[u8], file_len: u64) -> Result<Layout, SafetensorsError> {
    let header_len = header.len() as u64;
    let text = std::str::from_utf8(header).map_err(|_| SafetensorsError::NotUtf8)?;
    let data_len =
        file_len
            .checked_sub(8 + header_len)
            .ok_or(SafetensorsError::HeaderOutOfBounds {
                len: header_len,
                file_len,
            })?;
    let (metadata, mut tensors) = parse_top(text)?;

    // Sort by (start, end); a stable sort keeps header order among empty tensors at one offset.
    tensors.sort_by_key(|t| (t.offset, t.offset + t.len));
    let mut pos = 0u64;
    let mut prev: Option<&TensorInfo> = None;
    for t in &tensors {
        if t.offset < pos {
            return Err(SafetensorsError::Overlap {
                a: prev.map(|p| p.name.clone()).unwrap_or_default(),
                b: t.name.clone(),
            });
        }
        if t.offset > pos {
            return Err(SafetensorsError::Gap {
                name: t.name.clone(),
                gap: t.offset - pos,
            });
        }
        pos = t.offset + t.len;
        if pos > data_len {
            return Err(SafetensorsError::OutOfBounds {
                end: pos,
                len: data_len,
            });
        }
        prev = Some(t);
    }
    if pos < data_len {
        return Err(SafetensorsError::TrailingBytes {
            extra: data_len - pos,
        });
    }
    Ok(Layout {
        header_len,
        metadata,
        tensors,
    })
}

fn parse_entry(name: String, value: Value) -> Result<TensorInfo, SafetensorsError> {
    let bad = |detail: &str| SafetensorsError::BadEntry {
        name: name.clone(),
        detail: detail.into(),
    };
    if name.is_empty() {
        return Err(bad("empty tensor name"));
    }
    let Value::Object(map) = value else {
        return Err(bad("entry is not a JSON object"));
    };
    for key in map.keys() {
        if !matches!(key.as_str(), "dtype" | "shape" | "data_offsets") {
            return Err(bad(&format!("unknown field {key:?}")));
        }
    }
    let dtype_name = map
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("missing dtype"))?;
    let dtype = Dtype::from_name(dtype_name).ok_or_else(|| SafetensorsError::UnknownDtype {
        name: name.clone(),
        dtype: dtype_name.to_string(),
    })?;
    let shape = map
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("missing shape"))?
        .iter()
        .map(|d| {
            d.as_u64()
                .ok_or_else(|| bad("shape must hold non-negative integers"))
        })
        .collect::<Result<Vec<u64>, _>>()?;
    if shape.len() > TensorHeader::MAX_RANK {
        return Err(bad(&format!(
            "rank {} exceeds {}",
            shape.len(),
            TensorHeader::MAX_RANK
        )));
    }
    let offsets = map
        .get("data_offsets")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("missing data_offsets"))?;
    let [begin, end] = offsets.as_slice() else {
        return Err(bad("data_offsets must have two entries"));
    };
    let (Some(begin), Some(end)) = (begin.as_u64(), end.as_u64()) else {
        return Err(bad("data_offsets must be non-negative integers"));
    };
    if end < begin {
        return Err(bad("data_offsets end before they begin"));
    }
    let header = TensorHeader::new(dtype, shape);
    let needed = header
        .data_len()
        .ok_or_else(|| bad("shape size overflows"))?;
    if end - begin != needed {
        return Err(SafetensorsError::SizeMismatch {
            name,
            span: end - begin,
            shape: header.shape,
            dtype,
            needed,
        });
    }
    Ok(TensorInfo {
        name,
        header,
        offset: begin,
        len: needed,
    })
}

fn parse_metadata(value: Value) -> Result<Vec<(String, String)>, SafetensorsError> {
    match value {
        Value::Null => Ok(Vec::new()),
        Value::Object(map) => map
            .into_iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k, s)),
                _ => Err(SafetensorsError::Metadata(format!(
                    "value of {k:?} is not a string"
                ))),
            })
            .collect(),
        _ => Err(SafetensorsError::Metadata("is not an object".into())),
    }
}

/// A header's `__metadata__` and its tensors, in header order.
type Parsed = (Vec<(String, String)>, Vec<TensorInfo>);

/// Parses the top-level object: its `__metadata__` and its tensors, each entry checked and
/// turned into a [`TensorInfo`] as it is read (the JSON value of a million entries was held
/// whole once: 630 bytes an entry). Every key is seen, so duplicates are reported (a map type
/// would silently keep the last); the first fault in header order is the one reported.
fn parse_top(text: &str) -> Result<Parsed, SafetensorsError> {
    /// What was read, and whether `__metadata__` was an object.
    struct Entries(Parsed, bool);
    /// Where the visitor leaves a fault of ours (serde_json would keep only its text).
    struct Top<'a>(&'a std::cell::RefCell<Option<SafetensorsError>>);
    impl<'de> de::DeserializeSeed<'de> for Top<'_> {
        type Value = Entries;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Entries, D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de> Visitor<'de> for Top<'_> {
        type Value = Entries;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Entries, A::Error> {
            let (mut metadata, mut tensors) = (Vec::new(), Vec::new());
            let mut metadata_object = false;
            let mut seen = std::collections::HashSet::new();
            let mut fault = |e: SafetensorsError| {
                *self.0.borrow_mut() = Some(e);
                de::Error::custom("a bad entry")
            };
            while let Some(name) = m.next_key::<String>()? {
                if !seen.insert(name.clone()) {
                    return Err(fault(SafetensorsError::DuplicateName(name)));
                }
                let value: Value = m.next_value()?;
                if name == "__metadata__" {
                    metadata_object = value.is_object();
                    metadata = parse_metadata(value).map_err(&mut fault)?;
                } else {
                    tensors.push(parse_entry(name, value).map_err(&mut fault)?);
                }
            }
            Ok(Entries((metadata, tensors), metadata_object))
        }
    }
    let fault = std::cell::RefCell::new(None);
    let mut reader = serde_json::Deserializer::from_str(text);
    let parsed = de::DeserializeSeed::deserialize(Top(&fault), &mut reader)
        .and_then(|e| reader.end().map(|()| e));
    if let Some(e) = fault.into_inner() {
        return Err(e);
    }
    let Entries(parsed, metadata_object) =
        parsed.map_err(|e| SafetensorsError::Json(e.to_string()))?;
    // Duplicate keys inside __metadata__ would be merged by serde_json::Map; check them here.
    if metadata_object {
        check_metadata_duplicates(text)?;
    }
    Ok(parsed)
}

fn check_metadata_duplicates(text: &str) -> Result<(), SafetensorsError> {
    #[derive(serde::Deserialize)]
    struct Top {
        #[serde(rename = "__metadata__")]
        _metadata: Option<Dupes>,
    }
    struct Dupes;
    impl<'de> serde::Deserialize<'de> for Dupes {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Dupes;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Dupes, A::Error> {
                    let mut seen = std::collections::HashSet::new();
                    while let Some((k, _)) = m.next_entry::<String, de::IgnoredAny>()? {
                        if !seen.insert(k.clone()) {
                            return Err(de::Error::custom(format!("duplicate key {k:?}")));
                        }
                    }
                    Ok(Dupes)
                }
            }
            d.deserialize_map(V)
        }
    }
    serde_json::from_str::<Top>(text)
        .map(|_| ())
        .map_err(|e| SafetensorsError::Metadata(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_len(header: &str, data: u64) -> u64 {
        8 + header.len() as u64 + data
    }

    #[test]
    fn accepts_valid_header_in_data_order() {
        let h = r#"{"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},
                   "a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},
                   "e":{"dtype":"I64","shape":[0],"data_offsets":[16,16]},
                   "__metadata__":{"step":"3"}}   "#;
        let l = parse(h.as_bytes(), file_len(h, 16)).unwrap();
        let names: Vec<_> = l.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "e"]);
        assert_eq!(l.metadata, vec![("step".to_string(), "3".to_string())]);
        assert_eq!(l.data_start(), 8 + h.len() as u64);
    }

    #[test]
    fn rejects_each_violation() {
        let cases: &[(&str, u64, &str)] = &[
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#,
                16,
                "duplicate",
            ),
            (
                r#"{"a":{"dtype":"F99","shape":[2],"data_offsets":[0,8]}}"#,
                8,
                "unknown dtype",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
                8,
                "needs 12",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
                12,
                "overlap",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
                12,
                "unused",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
                4,
                "truncated",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
                9,
                "after the last",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}"#,
                8,
                "non-negative",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}}"#,
                8,
                "unknown field",
            ),
            (r#"{"__metadata__":{"k":1}}"#, 0, "not a string"),
            (r#"{"__metadata__":{"k":"1","k":"2"}}"#, 0, "duplicate key"),
            (r#"[1,2]"#, 0, "JSON"),
            (r#"{"a":"#, 0, "JSON"),
        ];
        for (h, data, want) in cases {
            let err = parse(h.as_bytes(), file_len(h, *data))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{h}: got {err:?}, wanted {want:?}");
            assert!(!err.contains('\n'));
        }
        assert_eq!(parse(&[0xff, 0xfe], 10), Err(SafetensorsError::NotUtf8));
    }

    #[test]
    fn header_length_checks() {
        assert!(matches!(
            header_len(&[0; 4], 4),
            Err(SafetensorsError::TooShort { .. })
        ));
        let big = (MAX_HEADER_LEN + 1).to_le_bytes();
        assert!(matches!(
            header_len(&big, u64::MAX),
            Err(SafetensorsError::HeaderTooLarge { .. })
        ));
        let n = 100u64.to_le_bytes();
        assert!(matches!(
            header_len(&n, 50),
            Err(SafetensorsError::HeaderOutOfBounds { .. })
        ));
        assert_eq!(header_len(&n, 108), Ok(100));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_headers_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300), len in 0u64..1000) {
            let _ = parse(&bytes, len);
        }
    }
}
