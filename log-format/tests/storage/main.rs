//! The log format's storage behaviour: round trips, torn tails, corruption
//! and bit flips, damage reports, seq gaps, interrupted rolls, power loss on
//! `MemFs` (also page by page, against commit marks), group commit, poisoning after an I/O error, pre-allocation and
//! `Fs::write_file_durably` (old or new file, whole, at every crash point).
//! One test binary: each file is the module it was as its own
//! binary, under the same name. `vectors`, `fuzz_like` and `record_limit`
//! stay binaries of their own: the first has a documented regenerate command,
//! the other two install a counting global allocator each.

#[path = "../common/mod.rs"]
mod common;

mod bit_flips;
mod commit_marks;
mod corruption;
mod damage_report;
mod durable_write;
mod from_checkpoint;
mod group_commit;
mod heal;
mod live_reader;
mod poison;
mod power_loss;
mod preallocation;
mod roll_interrupted;
mod roundtrip_prop;
mod seq_gap;
mod torn_tail;
