//! Kernel timings beside the device's copy bandwidth, for `examples/kernel-bench.rs` (the
//! `bench` feature; not part of the engine).

use mdl_codec::engine::{Engine, FloatView};
use mdl_codec::huffman::{Plan, Stream, StreamWriter};
use mdl_codec::planes::PlaneSpec;
use mdl_format::Dtype;

use super::coding::{assemble_streams, decode_on, encode_on};
use super::device::{launch_histogram, launch_planes, Geometry, Lane};
use super::{hash, residual, DriverError, Res};
use crate::GpuEngine;

/// One row of [`kernel_bench`]: a kernel, the bytes it reads and writes, and its median time.
#[derive(Clone, Debug)]
pub struct BenchRow {
    /// What ran.
    pub name: &'static str,
    /// Bytes read plus bytes written per run.
    pub bytes: u64,
    /// Median of the timed runs, in seconds.
    pub seconds: f64,
}

impl GpuEngine {
    /// Times the byte-moving kernels on `data` (f32 weights, already on the device) beside a
    /// device-to-device copy of the same bytes, with CUDA events: the medians of `runs` runs
    /// after one warm-up. For `examples/kernel-bench.rs`.
    pub fn kernel_bench(&self, data: &[u8], runs: usize) -> Result<Vec<BenchRow>, DriverError> {
        let gpu = &*self.gpu;
        // The residual quantizer's inputs, kept on the device as a commit keeps them: the
        // weights and a previous version a little away from them.
        let previous: Vec<u8> = data
            .chunks_exact(4)
            .flat_map(|c| (f32::from_le_bytes(c.try_into().unwrap()) * 0.999).to_le_bytes())
            .collect();
        let _kept = (self.keep(data), self.keep(&previous));
        gpu.with_lane(|lane| {
            let spec = PlaneSpec::planes(Dtype::F32, 0);
            let g = Geometry::of(spec, data.len());
            let n = g.n;
            let dev = lane.upload(data)?;
            let mut copy = lane.alloc::<u8>(data.len())?;
            let mut planes = lane.alloc::<u8>(g.planes_len())?;
            let mut merged = lane.alloc::<u8>(data.len())?;
            let mut hist = lane.zeros::<u64>(256 * g.planes)?;
            let time = |lane: &Lane, f: &mut dyn FnMut(&Lane) -> Res<()>| -> Res<f64> {
                f(lane)?;
                let mut t = Vec::with_capacity(runs);
                for _ in 0..runs {
                    let start = lane
                        .stream
                        .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
                    f(lane)?;
                    let end = lane
                        .stream
                        .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
                    end.synchronize()?;
                    t.push(start.elapsed_ms(&end)? as f64 / 1e3);
                }
                t.sort_by(f64::total_cmp);
                Ok(t[t.len() / 2])
            };
            let len = data.len() as u64;
            let mut rows = Vec::new();
            let s = time(lane, &mut |lane| lane.stream.memcpy_dtod(&*dev, &mut *copy))?;
            rows.push(BenchRow {
                name: "device copy (reference)",
                bytes: 2 * len,
                seconds: s,
            });
            let s = time(lane, &mut |lane| {
                launch_planes(
                    gpu,
                    lane,
                    "split_planes",
                    g,
                    &dev.slice(..),
                    None,
                    &mut planes,
                )
            })?;
            rows.push(BenchRow {
                name: "split f32 planes",
                bytes: 2 * len,
                seconds: s,
            });
            let s = time(lane, &mut |lane| {
                launch_planes(
                    gpu,
                    lane,
                    "merge_planes",
                    g,
                    &planes.slice(..),
                    None,
                    &mut merged,
                )
            })?;
            rows.push(BenchRow {
                name: "merge f32 planes",
                bytes: 2 * len,
                seconds: s,
            });
            let s = time(lane, &mut |lane| {
                launch_histogram(gpu, lane, g, &planes, &mut hist.slice_mut(..))
            })?;
            rows.push(BenchRow {
                name: "plane histograms",
                bytes: len,
                seconds: s,
            });
            let prefix = mdl_format::TensorHeader::new(Dtype::F32, vec![n]).canonical();
            let s = time(lane, &mut |lane| {
                hash::hash_on(gpu, lane, &prefix, &dev.slice(..)).map(drop)
            })?;
            rows.push(BenchRow {
                name: "tensor id (BLAKE3)",
                bytes: len,
                seconds: s,
            });
            // Whole-codec timings (host to host) for scale: encode and decode of the planes.
            let h = self.plane_histograms(spec, data, None, &[(true, false); 4]);
            let writers: Vec<StreamWriter> = h
                .iter()
                .map(|(h, _)| StreamWriter::new(Plan::choose(h, None).0))
                .collect();
            let t0 = std::time::Instant::now();
            let coded = encode_on(gpu, lane, spec, data, None, &writers)?;
            rows.push(BenchRow {
                name: "encode, host to host",
                bytes: len,
                seconds: t0.elapsed().as_secs_f64(),
            });
            let streams_bytes = assemble_streams(&writers, &coded);
            let streams: Vec<Stream<'_>> = streams_bytes
                .iter()
                .map(|b| Stream::parse(b, n).expect("own stream"))
                .collect();
            let mut out = vec![0u8; data.len()];
            let t0 = std::time::Instant::now();
            let ok = decode_on(gpu, lane, spec, &streams, None, &mut out)?;
            rows.push(BenchRow {
                name: "decode, host to host",
                bytes: len,
                seconds: t0.elapsed().as_secs_f64(),
            });
            assert!(ok && out == data, "decode did not give the data back");

            // The residual quantizer (host timers: each call ends in a fetch): a step search's
            // statistics at the commit's 15 steps on a 1-in-8 sample, and an encode whose
            // payload and reconstruction come back to the host. GB/s of raw weights.
            let view = FloatView {
                dtype: Dtype::F32,
                bytes: data,
            };
            let reference = Some(&previous[..]);
            let rms = (residual::distance_on(gpu, lane, view, reference)? / n as f64).sqrt();
            let steps: Vec<f64> = (-10..5).map(|k| rms * 2f64.powf(k as f64 / 2.0)).collect();
            let linear = mdl_codec::residual::Mode::Linear;
            let t0 = std::time::Instant::now();
            residual::measure_on(gpu, lane, view, reference, None, linear, &steps, 8)?;
            rows.push(BenchRow {
                name: "residual search, host to host",
                bytes: len,
                seconds: t0.elapsed().as_secs_f64(),
            });
            let t0 = std::time::Instant::now();
            residual::quantize_on(gpu, lane, view, reference, linear, rms)?;
            rows.push(BenchRow {
                name: "residual encode, host to host",
                bytes: len,
                seconds: t0.elapsed().as_secs_f64(),
            });
            Ok(rows)
        })
    }
}
