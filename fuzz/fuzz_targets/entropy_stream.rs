//! Untrusted bytes as an entropy stream: decoding must never panic, and a stream that decodes
//! must decode the same whether chunk by chunk or whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mdl_codec::huffman;

fuzz_target!(|input: &[u8]| {
    let Some((&n, bytes)) = input.split_first() else {
        return;
    };
    // Symbol counts up to a few chunks, so chunk tables and lanes are exercised.
    let n = (n as usize) * 2113;
    let mut out = vec![0u8; n];
    if huffman::decode_stream(bytes, &mut out).is_ok() {
        let stream = huffman::Stream::parse(bytes, n as u64).expect("parsed once already");
        let mut again = vec![0u8; n];
        for (i, c) in again.chunks_mut(stream.chunk_len()).enumerate() {
            stream
                .decode_chunk(i, c)
                .expect("chunks decoded once already");
        }
        assert_eq!(out, again);
    }
});
