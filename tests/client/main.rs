//! The phone's outbox (`spark_client`) against real servers: drain, lost
//! replies through a lossy proxy, messages and the clock window (the
//! `spark-client` command's own test is `client/tests/cli.rs`). One test binary: each file is the module
//! it was as its own binary, under the same name.

use spark_test_support::server as common;

mod client_drain;
mod client_events;
mod client_lossy;
mod client_messages;
