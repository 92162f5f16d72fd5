use crate::FormatError;

/// Element types of safetensors files that mdl stores. Tags are stable and never reused.
///
/// Sub-byte types (`F4`, `F6_*`) are rejected: their packing is not settled in the safetensors
/// specification, and storing them wrong would silently corrupt checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[allow(missing_docs)] // the variants are the safetensors names
pub enum Dtype {
    Bool = 1,
    U8 = 2,
    I8 = 3,
    F8E5M2 = 4,
    F8E4M3 = 5,
    I16 = 6,
    U16 = 7,
    F16 = 8,
    BF16 = 9,
    I32 = 10,
    U32 = 11,
    F32 = 12,
    F64 = 13,
    I64 = 14,
    U64 = 15,
    F8E8M0 = 16,
    C64 = 17,
}

const ALL: [Dtype; 17] = [
    Dtype::Bool,
    Dtype::U8,
    Dtype::I8,
    Dtype::F8E5M2,
    Dtype::F8E4M3,
    Dtype::I16,
    Dtype::U16,
    Dtype::F16,
    Dtype::BF16,
    Dtype::I32,
    Dtype::U32,
    Dtype::F32,
    Dtype::F64,
    Dtype::I64,
    Dtype::U64,
    Dtype::F8E8M0,
    Dtype::C64,
];

impl Dtype {
    /// Every dtype, in tag order.
    pub fn all() -> &'static [Dtype] {
        &ALL
    }

    /// Bytes per element.
    #[inline]
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 => 1,
            Dtype::F8E5M2 | Dtype::F8E4M3 | Dtype::F8E8M0 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::F64 | Dtype::I64 | Dtype::U64 | Dtype::C64 => 8,
        }
    }

    /// The name safetensors uses in its header.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E8M0 => "F8_E8M0",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
            Dtype::C64 => "C64",
        }
    }

    /// Parses a safetensors dtype name.
    pub fn from_name(name: &str) -> Option<Dtype> {
        ALL.iter().copied().find(|d| d.name() == name)
    }

    /// Whether values are IEEE-style binary floats with 16, 32 or 64 bits (the types the float
    /// codecs and numeric diffs understand).
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64)
    }
}

impl TryFrom<u8> for Dtype {
    type Error = FormatError;
    fn try_from(v: u8) -> Result<Self, FormatError> {
        ALL.iter()
            .copied()
            .find(|d| *d as u8 == v)
            .ok_or(FormatError::UnknownTag {
                what: "dtype",
                tag: v,
            })
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_and_names_round_trip() {
        for &d in Dtype::all() {
            assert_eq!(Dtype::try_from(d as u8).unwrap(), d);
            assert_eq!(Dtype::from_name(d.name()), Some(d));
        }
        assert!(Dtype::try_from(0).is_err());
        assert!(Dtype::try_from(200).is_err());
        assert_eq!(Dtype::from_name("F4"), None);
    }
}
