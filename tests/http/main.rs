//! The HTTP API against in-process servers on ephemeral ports: moments,
//! media, turns, messages, replays, access, limits, the OpenAPI document,
//! concurrent duplicates, the brains behind turns, the walk-throughs of
//! README.md and docs/ (word for word), and every link of the docs. One
//! test binary: each file is the module it was as its own binary, under
//! the same name.

use spark_test_support::server as common;

mod access;
mod brain_local;
mod brain_openai;
mod concurrency;
mod docs_links;
mod events_history;
mod events_slow;
mod headers;
mod limits;
mod media;
mod media_races;
mod messages;
mod moments_api;
mod openapi;
mod readme;
mod replayed;
mod seed_lesson;
mod turns;
mod web;
