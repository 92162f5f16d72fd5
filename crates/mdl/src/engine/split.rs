//! One engine for encoding and another for decoding: what `auto` uses where the GPU measured
//! faster on one side of the codecs only. Every kernel a commit runs (counting, splitting,
//! coding, the lossy statistics) goes to the encoder, the two that undo them (merging planes,
//! ungrouping code deltas) to the decoder. Both engines give identical bytes, so the split
//! changes speed only.

use std::sync::Arc;

use mdl_codec::engine::{
    Assigned, CodePairs, DeviceCopy, Engine, ErrorStats, FloatView, Kept, KeyStats, Lut, Mirror,
    Moments,
};
use mdl_codec::huffman::{Histogram, Stream, StreamWriter};
use mdl_codec::planes::PlaneSpec;
use mdl_codec::residual::{Mode, ResidualStats, Steps};
use mdl_format::{Dtype, FormatError, ObjectId};

/// Encoding on one engine, decoding on another (see the module docs).
#[derive(Debug)]
pub(super) struct Split {
    encoder: Arc<dyn Engine>,
    decoder: Arc<dyn Engine>,
}

impl Split {
    pub(super) fn new(encoder: Arc<dyn Engine>, decoder: Arc<dyn Engine>) -> Split {
        Split { encoder, decoder }
    }
}

impl Engine for Split {
    fn name(&self) -> &'static str {
        "split"
    }

    fn keep<'a>(&'a self, bytes: &'a [u8]) -> Kept<'a> {
        self.encoder.keep(bytes)
    }

    fn adopt<'a>(&'a self, bytes: &'a [u8], copy: DeviceCopy) -> Kept<'a> {
        self.encoder.adopt(bytes, copy)
    }

    fn keep_shared(&self, content: &Arc<Vec<u8>>, like: Option<&[u8]>) -> Kept<'static> {
        self.encoder.keep_shared(content, like)
    }

    // The decoder: a load it decoded onto its device is verified there (a commit's bytes
    // are on the host as well, so either engine hashes them right).
    fn content_id(&self, prefix: &[u8], data: &[u8]) -> ObjectId {
        self.decoder.content_id(prefix, data)
    }

    fn mirror_into(
        &self,
        out: &mut [u8],
        copy: DeviceCopy,
        fill: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> Mirror {
        self.decoder.mirror_into(out, copy, fill)
    }

    fn plane_histograms(
        &self,
        spec: PlaneSpec,
        data: &[u8],
        base: Option<&[u8]>,
        want: &[(bool, bool)],
    ) -> Vec<(Histogram, Histogram)> {
        self.encoder.plane_histograms(spec, data, base, want)
    }

    fn sample_histograms(
        &self,
        spec: PlaneSpec,
        data: &[u8],
        base: Option<&[u8]>,
    ) -> Vec<(Histogram, Histogram)> {
        self.encoder.sample_histograms(spec, data, base)
    }

    fn encode_planes(
        &self,
        spec: PlaneSpec,
        data: &[u8],
        base: Option<&[u8]>,
        writers: &[StreamWriter],
    ) -> Vec<Vec<Vec<u8>>> {
        self.encoder.encode_planes(spec, data, base, writers)
    }

    fn splits_on_host(&self, data: &[u8]) -> bool {
        self.encoder.splits_on_host(data)
    }

    fn split_planes(
        &self,
        spec: PlaneSpec,
        data: &[u8],
        base: Option<&[u8]>,
        planes: &mut Vec<Vec<u8>>,
    ) {
        self.encoder.split_planes(spec, data, base, planes)
    }

    fn encode_split(&self, planes: &[&[u8]], writers: &[StreamWriter]) -> Vec<Vec<Vec<u8>>> {
        self.encoder.encode_split(planes, writers)
    }

    fn decode_planes(
        &self,
        spec: PlaneSpec,
        streams: &[Stream<'_>],
        base: Option<&[u8]>,
        out: &mut [u8],
    ) -> Result<(), FormatError> {
        self.decoder.decode_planes(spec, streams, base, out)
    }

    fn key_stats(&self, w: FloatView<'_>, moments: Option<Moments<'_>>) -> KeyStats {
        self.encoder.key_stats(w, moments)
    }

    fn assign(&self, w: FloatView<'_>, lut: &Lut) -> Assigned {
        self.encoder.assign(w, lut)
    }

    fn code_pairs(
        &self,
        w: FloatView<'_>,
        lut: &Lut,
        bins: usize,
        base: &[u8],
        base_bins: usize,
    ) -> CodePairs {
        self.encoder.code_pairs(w, lut, bins, base, base_bins)
    }

    fn group_delta(&self, base: &[u8], cur: &[u8], modulus: u8) -> Vec<u8> {
        self.encoder.group_delta(base, cur, modulus)
    }

    fn ungroup_delta(
        &self,
        base: &[u8],
        deltas: &[u8],
        modulus: u8,
        out: &mut [u8],
    ) -> Result<(), FormatError> {
        self.decoder.ungroup_delta(base, deltas, modulus, out)
    }

    fn mean_second_moment(&self, w: FloatView<'_>, moments: Moments<'_>) -> f64 {
        self.encoder.mean_second_moment(w, moments)
    }

    fn residual_distance(&self, values: FloatView<'_>, reference: Option<&[u8]>) -> f64 {
        self.encoder.residual_distance(values, reference)
    }

    fn residual_measure(
        &self,
        values: FloatView<'_>,
        reference: Option<&[u8]>,
        moments: Option<Moments<'_>>,
        mode: Mode,
        factors: Option<&Steps>,
        steps: &[f64],
        every: usize,
    ) -> Vec<ResidualStats> {
        self.encoder
            .residual_measure(values, reference, moments, mode, factors, steps, every)
    }

    fn residual_encode(
        &self,
        values: FloatView<'_>,
        reference: Option<&[u8]>,
        mode: Mode,
        factors: Option<&Steps>,
        step: f64,
    ) -> (Vec<u8>, Vec<u8>) {
        self.encoder
            .residual_encode(values, reference, mode, factors, step)
    }

    fn residual_decode(
        &self,
        dtype: Dtype,
        payload: &[u8],
        reference: Option<&[u8]>,
        out: &mut [u8],
    ) -> Result<(), FormatError> {
        self.decoder.residual_decode(dtype, payload, reference, out)
    }

    fn error_stats(
        &self,
        orig: FloatView<'_>,
        recon: FloatView<'_>,
        moments: Option<Moments<'_>>,
    ) -> ErrorStats {
        self.encoder.error_stats(orig, recon, moments)
    }
}
