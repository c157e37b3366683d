//! The web (SPEC section 12, issue 17): the numbers the TypeScript client
//! reads from the OpenAPI document.

use serde_json::Value;
use spark_engine::api::openapi::document;

/// `info.x-spark-message-clock` in `src/api/openapi.json`, which the
/// TypeScript client's generated `rules.ts` is made from, says what
/// `spark_core::wire` says: the clock window and the reuse margin (SPEC
/// sections 5 and 6) live once, in Rust, and the document carries them.
#[test]
fn the_documented_message_clock_is_the_wire_constants() {
    let doc: Value = serde_json::from_str(document()).expect("the document is JSON");
    let clock = &doc["info"]["x-spark-message-clock"];
    assert_eq!(
        clock["window_ms"].as_u64(),
        Some(spark_core::wire::CLOCK_WINDOW_MS),
        "window_ms"
    );
    assert_eq!(
        clock["reuse_margin_ms"].as_u64(),
        Some(spark_core::wire::REUSE_MARGIN_MS),
        "reuse_margin_ms"
    );
}
