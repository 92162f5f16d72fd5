//! Tensor codecs: how an object's bytes become a record payload and back.
//!
//! Every codec has a stable [`CodecTag`] that is persisted in records and never reused. Policies
//! ("pick the smallest") are not codecs: [`candidates`] lists what a commit tries for a tensor,
//! and the store keeps whichever payload is smallest. [`CodecTag::Raw`] and [`CodecTag::Zstd`]
//! stream; the float codecs ([`CodecTag::FloatSplit`], [`CodecTag::XorDelta`], module [`float`])
//! work on whole tensors in memory, chunk-parallel, over the entropy coder of [`huffman`]. How a
//! commit chooses among them: `docs/CODECS.md`.
//!
//! ```
//! use mdl_codec::{decode_to_vec, encode, CodecTag};
//! let data = vec![7u8; 4096];
//! let mut payload = Vec::new();
//! encode(CodecTag::Zstd, &data, &Default::default(), &mut payload).unwrap();
//! assert!(payload.len() < data.len());
//! assert_eq!(decode_to_vec(CodecTag::Zstd, &payload, data.len() as u64).unwrap(), data);
//! ```

pub mod cast;
pub mod engine;
pub mod float;
pub mod huffman;
pub mod planes;
pub mod qrecord;
pub mod quant;
pub mod rans;
pub mod residual;
pub mod scalar;
mod tensor;
pub mod trim;
mod varint;

use std::io::{self, Read, Write};

use mdl_format::{Dtype, FormatError};

/// Stable codec tags. Values are persisted; a retired codec's number is never given to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum CodecTag {
    /// The bytes as they are.
    Raw = 0,
    /// Zstandard, one frame.
    Zstd = 1,
    /// Float planes (exponent, sign+mantissa), each entropy-coded: [`float`].
    FloatSplit = 2,
    /// Float planes of `value ^ base`, each entropy-coded: [`float`].
    XorDelta = 3,
    /// Quantized tensor: code table, protected elements, entropy-coded codes ([`qrecord`]).
    QuantBase = 4,
    /// Quantized tensor as grouped, run-length-coded code differences from a base quant
    /// object ([`qrecord`]).
    QuantDelta = 5,
    /// Mantissa-trimmed floats ([`trim`]) in float-split planes.
    MantissaTrim = 6,
    /// Byte planes of the zigzag-mapped integer difference `value − base`: [`float`].
    SubDelta = 7,
    /// A lossy tensor as its base object's content plus a uniformly quantized residual:
    /// [`residual`].
    QuantResidual = 8,
    /// A lossy tensor uniformly quantized on its own: [`residual`] against zeros.
    QuantUniform = 9,
    /// A 16-bit tensor as its base's (an `F32` master copy's) cast to nearest even, with the
    /// elements where it is not: [`cast`].
    Cast = 10,
}

impl CodecTag {
    /// Name shown in `mdl show` and JSON.
    pub fn name(self) -> &'static str {
        match self {
            CodecTag::Raw => "raw",
            CodecTag::Zstd => "zstd",
            CodecTag::FloatSplit => "float-split",
            CodecTag::XorDelta => "xor-delta",
            CodecTag::SubDelta => "sub-delta",
            CodecTag::QuantBase => "quant-base",
            CodecTag::QuantDelta => "quant-delta",
            CodecTag::MantissaTrim => "mantissa-trim",
            CodecTag::QuantResidual => "quant-residual",
            CodecTag::QuantUniform => "quant-uniform",
            CodecTag::Cast => "cast",
        }
    }

    /// The lossless delta codec whose payloads hold `transform`'s planes.
    pub fn delta(transform: planes::Transform) -> CodecTag {
        match transform {
            planes::Transform::Planes => CodecTag::XorDelta,
            planes::Transform::Sub => CodecTag::SubDelta,
        }
    }

    /// Whether records with this codec name a base object.
    pub fn has_base(self) -> bool {
        match self {
            CodecTag::Raw
            | CodecTag::Zstd
            | CodecTag::FloatSplit
            | CodecTag::QuantBase
            | CodecTag::MantissaTrim
            | CodecTag::QuantUniform => false,
            CodecTag::XorDelta
            | CodecTag::SubDelta
            | CodecTag::QuantDelta
            | CodecTag::QuantResidual
            | CodecTag::Cast => true,
        }
    }

    /// Whether payloads decode as a stream ([`decoder`]); the others decode whole tensors in
    /// memory, chunks in parallel ([`float::decode`]).
    pub fn is_streaming(self) -> bool {
        matches!(self, CodecTag::Raw | CodecTag::Zstd)
    }

    /// Whether the codec is one of the quantized ones, whose deltas are taken against codes.
    pub fn is_quant(self) -> bool {
        matches!(self, CodecTag::QuantBase | CodecTag::QuantDelta)
    }
}

impl TryFrom<u8> for CodecTag {
    type Error = FormatError;
    fn try_from(v: u8) -> Result<Self, FormatError> {
        match v {
            0 => Ok(CodecTag::Raw),
            1 => Ok(CodecTag::Zstd),
            2 => Ok(CodecTag::FloatSplit),
            3 => Ok(CodecTag::XorDelta),
            4 => Ok(CodecTag::QuantBase),
            5 => Ok(CodecTag::QuantDelta),
            6 => Ok(CodecTag::MantissaTrim),
            7 => Ok(CodecTag::SubDelta),
            8 => Ok(CodecTag::QuantResidual),
            9 => Ok(CodecTag::QuantUniform),
            10 => Ok(CodecTag::Cast),
            tag => Err(FormatError::UnknownTag { what: "codec", tag }),
        }
    }
}

impl std::fmt::Display for CodecTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Settings that influence encoding (never decoding).
#[derive(Clone, Debug)]
pub struct EncodeOptions {
    /// zstd compression level.
    pub zstd_level: i32,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions { zstd_level: 3 }
    }
}

/// Tensors below this size are stored raw or zstd only: the float codecs' tables would outweigh
/// their gain.
pub const SMALL_TENSOR: u64 = 4096;

/// Float tensors below [`SMALL_TENSOR`] but of this size and more may still be stored or sent as
/// masked deltas (`float::encode_masked`): a bias with a few elements changed is tens of bytes.
pub const SMALL_DELTA: u64 = 256;

/// The streaming codecs a commit tries for a tensor that the float codecs do not take (or
/// cannot shrink), most promising first. [`CodecTag::Raw`] is always the fallback and is not
/// listed.
pub fn candidates(dtype: Dtype, len: u64) -> &'static [CodecTag] {
    let _ = dtype;
    if len < 64 {
        &[]
    } else {
        &[CodecTag::Zstd]
    }
}

/// Encodes `data` with `tag`, writing the payload to `out`; returns the payload length.
///
/// Writers may refuse to take more bytes (see the store's size-capped writer); that error is
/// returned as is, so a caller can give up on a codec that is not paying.
pub fn encode(
    tag: CodecTag,
    data: &[u8],
    opts: &EncodeOptions,
    out: &mut dyn Write,
) -> io::Result<u64> {
    encode_observed(tag, data, opts, out, &mut |_| {})
}

/// Like [`encode`], but copies the input through a scratch buffer in 1 MiB steps and shows
/// each step to `observe` before encoding it, so what is observed (hashed) is exactly what is
/// encoded even if the input memory changes underneath (a checkpoint file rewritten while it is
/// mapped).
pub fn encode_observed(
    tag: CodecTag,
    data: &[u8],
    opts: &EncodeOptions,
    out: &mut dyn Write,
    observe: &mut dyn FnMut(&[u8]),
) -> io::Result<u64> {
    let mut scratch = vec![0u8; data.len().min(1 << 20)];
    let mut counter = Counting { inner: out, n: 0 };
    let mut feed = |sink: &mut dyn Write| -> io::Result<()> {
        for chunk in data.chunks(1 << 20) {
            let buf = &mut scratch[..chunk.len()];
            buf.copy_from_slice(chunk);
            observe(buf);
            sink.write_all(buf)?;
        }
        Ok(())
    };
    match tag {
        CodecTag::Raw => feed(&mut counter)?,
        CodecTag::Zstd if data.len() <= ZSTD_WHOLE => {
            // One block: compressed whole with the thread's context, the same frame.
            let buf = &mut scratch[..data.len()];
            buf.copy_from_slice(data);
            observe(buf);
            counter.write_all(&zstd_whole(buf, opts.zstd_level)?)?;
        }
        CodecTag::Zstd => {
            let mut enc = zstd::stream::Encoder::new(&mut counter, opts.zstd_level)?;
            enc.include_checksum(false)?;
            enc.set_pledged_src_size(Some(data.len() as u64))?;
            feed(&mut enc)?;
            enc.finish()?;
        }
        _ => return Err(not_streaming(tag)),
    }
    Ok(counter.n)
}

/// A streaming decoder reading a payload and producing exactly `content_len` bytes; a payload
/// that decodes to more or fewer bytes is an error.
pub fn decoder<'a>(
    tag: CodecTag,
    payload: Box<dyn Read + 'a>,
    content_len: u64,
) -> io::Result<Box<dyn Read + 'a>> {
    let inner: Box<dyn Read + 'a> = match tag {
        CodecTag::Raw => payload,
        CodecTag::Zstd => Box::new(zstd::stream::Decoder::new(payload)?),
        _ => return Err(not_streaming(tag)),
    };
    Ok(Box::new(Exact {
        inner,
        left: content_len,
    }))
}

fn not_streaming(tag: CodecTag) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{tag} payloads are not streamed"),
    )
}

/// Payloads of the streaming codecs up to this size are decoded whole, in memory
/// ([`decode_into`]); larger ones stream ([`decoder`]).
pub const IN_MEMORY_STREAM: u64 = 1 << 20;

thread_local! {
    /// One zstd decompression context a thread: making one costs more than decoding the
    /// few kilobytes of a small tensor.
    static ZSTD_DCTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// Decodes a whole payload of a streaming codec held in memory into `out`, which must be
/// exactly the recorded content length; a payload that decodes to more or fewer bytes is an
/// error.
pub fn decode_into(tag: CodecTag, payload: &[u8], out: &mut [u8]) -> io::Result<()> {
    let n = match tag {
        CodecTag::Raw => {
            if payload.len() == out.len() {
                out.copy_from_slice(payload);
            }
            payload.len()
        }
        CodecTag::Zstd => ZSTD_DCTX.with(|cell| -> io::Result<usize> {
            let mut cell = cell.borrow_mut();
            let dctx = match cell.as_mut() {
                Some(d) => d,
                None => cell.insert(zstd::bulk::Decompressor::new()?),
            };
            dctx.decompress_to_buffer(payload, out).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("zstd payload does not decode to the recorded length: {e}"),
                )
            })
        })?,
        _ => return Err(not_streaming(tag)),
    };
    if n != out.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "payload decodes to {n} bytes where the record says {}",
                out.len()
            ),
        ));
    }
    Ok(())
}

thread_local! {
    /// One zstd compression context a thread, for payloads compressed whole.
    static ZSTD_CCTX: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { std::cell::RefCell::new(None) };
}

/// Inputs up to this size (one zstd block) are compressed whole with the thread's context
/// ([`zstd_whole`]): the frame is the one the streaming encoder writes (a test holds it).
const ZSTD_WHOLE: usize = 128 << 10;

/// Compresses `data` whole with zstd at `level`, with the thread's context: the same frame the
/// streaming encoder writes (content size, no checksum).
fn zstd_whole(data: &[u8], level: i32) -> io::Result<Vec<u8>> {
    ZSTD_CCTX.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.as_ref().is_none_or(|(l, _)| *l != level) {
            let mut c = zstd::bulk::Compressor::new(level)?;
            c.include_checksum(false)?;
            c.include_contentsize(true)?;
            *cell = Some((level, c));
        }
        let (_, c) = cell.as_mut().expect("set above");
        c.compress(data)
    })
}

/// Decodes a whole payload held in memory.
pub fn decode_to_vec(tag: CodecTag, payload: &[u8], content_len: u64) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(content_len.min(payload.len() as u64 * 64) as usize);
    decoder(tag, Box::new(payload), content_len)?.read_to_end(&mut out)?;
    Ok(out)
}

struct Counting<'a> {
    inner: &'a mut dyn Write,
    n: u64,
}

impl Write for Counting<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Enforces the declared decoded length.
struct Exact<'a> {
    inner: Box<dyn Read + 'a>,
    left: u64,
}

impl Read for Exact<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            // Anything more in the payload means the record lied about its length.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "payload decodes to more bytes than recorded",
                )),
            };
        }
        let want = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "payload ends {} bytes short of the recorded length",
                    self.left
                ),
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Runs `f` on a pool of `threads` threads (tests that check a result does not depend on the
/// thread count).
#[cfg(test)]
pub(crate) fn on_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool")
        .install(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> [CodecTag; 2] {
        [CodecTag::Raw, CodecTag::Zstd]
    }

    #[test]
    fn tags_are_stable() {
        assert_eq!(CodecTag::Raw as u8, 0);
        assert_eq!(CodecTag::Zstd as u8, 1);
        for t in all() {
            assert_eq!(CodecTag::try_from(t as u8).unwrap(), t);
        }
        assert_eq!(CodecTag::FloatSplit as u8, 2);
        assert_eq!(CodecTag::XorDelta as u8, 3);
        assert_eq!(CodecTag::SubDelta as u8, 7);
        assert_eq!(CodecTag::QuantBase as u8, 4);
        assert_eq!(CodecTag::QuantDelta as u8, 5);
        assert_eq!(CodecTag::QuantResidual as u8, 8);
        assert_eq!(CodecTag::QuantUniform as u8, 9);
        assert_eq!(CodecTag::MantissaTrim as u8, 6);
        assert_eq!(CodecTag::Cast as u8, 10);
        for t in 0..=10 {
            assert_eq!(CodecTag::try_from(t).unwrap() as u8, t);
        }
        assert!(CodecTag::try_from(11).is_err());
    }

    #[test]
    fn round_trips_and_length_checks() {
        let inputs: Vec<Vec<u8>> = vec![
            vec![],
            vec![1],
            (0..100_000u32)
                .flat_map(|i| (i as f32).sin().to_le_bytes())
                .collect(),
            vec![0; 3_000_000],
        ];
        for data in &inputs {
            for t in all() {
                let mut p = Vec::new();
                let n = encode(t, data, &EncodeOptions::default(), &mut p).unwrap();
                assert_eq!(n, p.len() as u64);
                assert_eq!(
                    &decode_to_vec(t, &p, data.len() as u64).unwrap(),
                    data,
                    "{t}"
                );
                assert!(decode_to_vec(t, &p, data.len() as u64 + 1).is_err());
                if !data.is_empty() {
                    assert!(decode_to_vec(t, &p, data.len() as u64 - 1).is_err());
                }
                // Whole in memory: the same bytes, the same length checks.
                let mut out = vec![0xAA; data.len()];
                decode_into(t, &p, &mut out).unwrap();
                assert_eq!(&out, data, "{t}");
                assert!(decode_into(t, &p, &mut vec![0; data.len() + 1]).is_err());
                if !data.is_empty() {
                    assert!(decode_into(t, &p, &mut vec![0; data.len() - 1]).is_err());
                }
            }
        }
    }

    #[test]
    fn whole_zstd_frames_are_the_streamed_ones() {
        let sines = |n: u32| -> Vec<u8> {
            (0..n)
                .flat_map(|i| (i as f32).sin().to_le_bytes())
                .collect()
        };
        for data in [
            vec![],
            vec![3u8; 100],
            sines(1023),
            (0..ZSTD_WHOLE as u32).map(|i| (i % 251) as u8).collect(),
            sines(ZSTD_WHOLE as u32 / 4),
        ] {
            let mut streamed = Vec::new();
            let mut enc = zstd::stream::Encoder::new(&mut streamed, 3).unwrap();
            enc.include_checksum(false).unwrap();
            enc.set_pledged_src_size(Some(data.len() as u64)).unwrap();
            std::io::Write::write_all(&mut enc, &data).unwrap();
            enc.finish().unwrap();
            let whole = zstd_whole(&data, 3).unwrap();
            assert_eq!(whole, streamed, "{} bytes", data.len());
        }
    }

    #[test]
    fn observed_encoding_matches_plain() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        for t in all() {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            encode(t, &data, &EncodeOptions::default(), &mut a).unwrap();
            let mut seen = Vec::new();
            let n = encode_observed(t, &data, &EncodeOptions::default(), &mut b, &mut |c| {
                seen.extend_from_slice(c)
            })
            .unwrap();
            assert_eq!(n, b.len() as u64);
            assert_eq!(seen, data);
            assert_eq!(decode_to_vec(t, &b, data.len() as u64).unwrap(), data);
            assert_eq!(a.len(), b.len());
        }
    }

    proptest::proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300), len in 0u64..1 << 40) {
            for t in all() {
                let _ = decode_into(t, &bytes, &mut vec![0; (len % 100_000) as usize]);
                let _ = decoder(t, Box::new(&bytes[..]), len).and_then(|mut d| {
                    let mut sink = [0u8; 4096];
                    for _ in 0..4 { if d.read(&mut sink)? == 0 { break; } }
                    Ok(())
                });
            }
        }
    }
}
