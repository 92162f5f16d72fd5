//! The float tensors the kernels read ([`FloatView`], with their Adam [`Moments`]) and the
//! error a reconstruction makes ([`ErrorStats`]): what the engines and the lossy codecs share.

use mdl_format::Dtype;

use crate::scalar;

/// A float tensor (bf16, f16 or f32), little-endian.
#[derive(Clone, Copy, Debug)]
pub struct FloatView<'a> {
    /// Element type.
    pub dtype: Dtype,
    /// The elements' bytes.
    pub bytes: &'a [u8],
}

impl FloatView<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    #[inline]
    pub(crate) fn value(&self, i: usize) -> f64 {
        scalar::value(self.dtype, self.bytes, i)
    }
}

/// A parameter's Adam moments: first (`m`, `exp_avg`) and second (`v`, `exp_avg_sq`), each
/// with as many elements as the parameter.
#[derive(Clone, Copy, Debug)]
pub struct Moments<'a> {
    /// First moment.
    pub m: FloatView<'a>,
    /// Second moment.
    pub v: FloatView<'a>,
}

/// Error of a reconstruction against its original, with the moment-weighted sums of the
/// quality estimate (zero without moments). Non-finite pairs are skipped.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ErrorStats {
    /// max |recon − orig|
    pub max_abs: f64,
    /// Σ (recon − orig)²
    pub sum_sq_err: f64,
    /// Σ orig²
    pub sum_sq: f64,
    /// Σ m·(recon − orig)
    pub sum_m_delta: f64,
    /// Σ v·(recon − orig)²
    pub sum_v_delta2: f64,
}

impl ErrorStats {
    /// Combines per-chunk results (of [`crate::engine::ERROR_CHUNK`] elements each) in chunk order: the
    /// one order every engine sums in.
    pub fn fold(chunks: &[ErrorStats]) -> ErrorStats {
        chunks.iter().fold(ErrorStats::default(), |mut a, e| {
            a.max_abs = a.max_abs.max(e.max_abs);
            a.sum_sq_err += e.sum_sq_err;
            a.sum_sq += e.sum_sq;
            a.sum_m_delta += e.sum_m_delta;
            a.sum_v_delta2 += e.sum_v_delta2;
            a
        })
    }

    /// Relative L2 error (0 for an all-zero original).
    pub fn rel_l2(&self) -> f64 {
        if self.sum_sq > 0.0 {
            (self.sum_sq_err / self.sum_sq).sqrt()
        } else {
            self.sum_sq_err.sqrt()
        }
    }
}
