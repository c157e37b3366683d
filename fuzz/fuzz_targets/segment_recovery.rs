//! Arbitrary bytes as the last segment, or as a sealed one, of a log on
//! `MemFs`, through `LogReader` and `Log::open`: no panic, no allocation
//! sized from a length field, reader and recovery agree, and a recovered log
//! reopens unchanged and takes appends. The first byte picks the layout. The
//! checks live in `log-format/tests/fuzz_entry/mod.rs`, shared with the
//! stable-toolchain test `log-format/tests/fuzz_like.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../log-format/tests/fuzz_entry/mod.rs"]
mod fuzz_entry;

fuzz_target!(|data: &[u8]| {
    let _ = fuzz_entry::segment_recovery(data);
});
