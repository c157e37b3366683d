//! Arbitrary bytes into the record and header decoders: no panic, no
//! allocation at all, every accepted frame re-encodes to its exact bytes.
//! The checks live in `log-format/tests/fuzz_entry/mod.rs`, shared with the
//! stable-toolchain test `log-format/tests/fuzz_like.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../log-format/tests/fuzz_entry/mod.rs"]
mod fuzz_entry;

fuzz_target!(|data: &[u8]| {
    fuzz_entry::record_decoder(data);
});
