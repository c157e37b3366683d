//! The server's archive (SPEC section 11) and what stands on it, with a
//! `weed mini` S3 store of each test's own: the real `spark-engine`
//! shipping under load and killed (-9), `sync` mode, leases, take-overs
//! racing, read replicas, and nginx in front of two shards. One test
//! binary: each file is a module of it. What `spark-replay` does with an
//! archive (`restore`, `verify --from`, `audit archive`, archived
//! checkpoints, gaps) is tested in `replay-tools/tests/tools/`.
//!
//! Without `weed` (`SPARK_WEED`, or on `PATH`) the tests print
//! `skipped: ...`, as they do without nginx for the proxy test; those that
//! check the archive with `spark-replay` (a restore, `verify --from`) skip
//! the same way when it is not built (`spark-replay` belongs to
//! `spark-replay-tools`: `cargo test --workspace` builds it, a test of this
//! package alone does not). `SPARK_REQUIRE_S3=1`, `SPARK_REQUIRE_NGINX=1`
//! and `SPARK_REQUIRE_REPLAY=1` (all set by `.ci/run`) make them fail
//! instead.

use spark_test_support::server as common;
use spark_test_support::{s3 as s3_common, weed};

mod archive_erasure;
mod archive_kill9;
mod archive_lease;
mod archive_retention;
mod archive_sync;
mod archive_takeover;
mod proxy;
mod replica;
mod replica_erasure;
