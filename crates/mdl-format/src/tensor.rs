use crate::wire::{Reader, Writer};
use crate::{Dtype, FormatError, ObjectId, ObjectKind, TensorHasher};

/// The canonical description of a tensor, hashed in front of its bytes to form its id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorHeader {
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions; empty for a 0-d scalar.
    pub shape: Vec<u64>,
}

impl TensorHeader {
    /// Most dimensions a tensor may have.
    pub const MAX_RANK: usize = 64;

    /// A header for the given dtype and shape.
    pub fn new(dtype: Dtype, shape: Vec<u64>) -> Self {
        TensorHeader { dtype, shape }
    }

    /// Number of elements, or `None` on overflow.
    pub fn numel(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// Size of the tensor's data in bytes, or `None` on overflow.
    pub fn data_len(&self) -> Option<u64> {
        self.numel()?.checked_mul(self.dtype.size() as u64)
    }

    /// The canonical bytes: kind `1`, dtype tag, rank, then each dimension as u64 LE.
    pub fn canonical(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u8(ObjectKind::Tensor as u8)
            .u8(self.dtype as u8)
            .u8(self.shape.len() as u8);
        for &d in &self.shape {
            w.u64(d);
        }
        w.buf
    }

    /// Parses [`Self::canonical`] bytes.
    pub fn from_canonical(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(bytes, "tensor header");
        let kind = r.u8()?;
        if kind != ObjectKind::Tensor as u8 {
            return Err(FormatError::invalid(
                "tensor header",
                format!("kind {kind} is not 1"),
            ));
        }
        let dtype = Dtype::try_from(r.u8()?)?;
        let rank = r.u8()? as usize;
        if rank > Self::MAX_RANK {
            return Err(FormatError::invalid(
                "tensor header",
                format!("rank {rank} too large"),
            ));
        }
        let shape = (0..rank).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
        r.finish()?;
        let header = TensorHeader { dtype, shape };
        if header.data_len().is_none() {
            return Err(FormatError::invalid("tensor header", "size overflows u64"));
        }
        Ok(header)
    }

    /// A hasher primed with this header; feed it the data to get the id.
    pub fn hasher(&self) -> TensorHasher {
        TensorHasher::new(&self.canonical())
    }

    /// The id of a tensor with this header and these bytes.
    pub fn object_id(&self, data: &[u8]) -> ObjectId {
        let mut h = self.hasher();
        h.update(data);
        h.finalize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_round_trip_and_identity() {
        let h = TensorHeader::new(Dtype::BF16, vec![3, 0, 7]);
        assert_eq!(TensorHeader::from_canonical(&h.canonical()).unwrap(), h);
        assert_eq!(h.data_len(), Some(0));
        let scalar = TensorHeader::new(Dtype::F64, vec![]);
        assert_eq!(scalar.data_len(), Some(8));
        // Same bytes under another shape or dtype are another object.
        let a = TensorHeader::new(Dtype::F32, vec![4]).object_id(&[0; 16]);
        let b = TensorHeader::new(Dtype::F32, vec![2, 2]).object_id(&[0; 16]);
        let c = TensorHeader::new(Dtype::I32, vec![4]).object_id(&[0; 16]);
        assert!(a != b && a != c && b != c);
    }

    #[test]
    fn rejects_garbage() {
        assert!(TensorHeader::from_canonical(&[]).is_err());
        assert!(TensorHeader::from_canonical(&[1, 12, 1, 0]).is_err());
        assert!(TensorHeader::from_canonical(&[2, 12, 0]).is_err());
        let mut huge = vec![1, 12, 2];
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(TensorHeader::from_canonical(&huge).is_err());
    }
}
