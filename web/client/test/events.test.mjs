// The event stream's cursor (issue 24): the client follows the ids the
// server gives (SEQ.CHAIN), starts from /api/log/head's cursor, and when
// the server refuses its cursor as another history's (409 cursor_unknown,
// which an EventSource cannot see) it emits `resync` and follows after the
// head the answer names, instead of going on after its seq.
import { test } from "node:test";
import assert from "node:assert/strict";
import { IDBFactory } from "fake-indexeddb";
import { SparkClient } from "../dist/index.js";
import { FakeEngine } from "./fake-engine.mjs";
import "./helpers.mjs";

/** A stand-in EventSource: records each one made; the test drives it. */
class FakeSource extends EventTarget {
  static made = [];
  constructor(url, init) {
    super();
    this.url = url;
    this.init = init;
    this.readyState = 0;
    this.onmessage = null;
    this.onerror = null;
    FakeSource.made.push(this);
  }
  change(id, notice) {
    this.readyState = 1;
    this.onmessage?.({ data: JSON.stringify(notice), lastEventId: id });
  }
  /** The server answered with something other than a stream. */
  refused() {
    this.readyState = 2;
    this.onerror?.(new Event("error"));
  }
  close() {
    this.readyState = 2;
  }
}

const waitFor = async (what, check) => {
  const deadline = Date.now() + 10_000;
  while (!check()) {
    assert.ok(Date.now() < deadline, `no ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
};

const problem = (status, body) => new Response(JSON.stringify(body), { status, headers: { "content-type": "application/problem+json" } });

test("a cursor of another history: resync, then the stream follows after the head the 409 names", async () => {
  FakeSource.made = [];
  const engine = new FakeEngine(() => Date.now());
  const asked = [];
  engine.handle = async ({ method, path }) => {
    asked.push(`${method} ${path}`);
    if (path === "/api/log/head") return new Response(JSON.stringify({ seq: 2, segment: "s", chain: "ab".repeat(32), cursor: "2.abababababababab" }), { status: 200, headers: { "content-type": "application/json" } });
    if (path === "/api/events")
      return problem(409, {
        type: "urn:spark:problem:cursor_unknown",
        title: "Cursor of another history",
        status: 409,
        detail: "another history",
        code: "cursor_unknown",
        after: 3,
        head_seq: 5,
        head_cursor: "5.0101010101010101",
      });
    return problem(404, { code: "not_found" });
  };
  const client = await SparkClient.open({
    fetch: engine.fetch,
    indexedDB: new IDBFactory(),
    dbName: "spark-events-test",
    tabs: false,
    events: true,
    eventSource: FakeSource,
    autoSend: false,
    channelName: "events-test",
  });
  const resyncs = [];
  client.addEventListener("resync", (e) => resyncs.push(e.detail));
  const changes = [];
  client.addEventListener("change", (e) => changes.push(e.detail.seq));
  await waitFor("a stream", () => FakeSource.made.length === 1);
  // It starts from the head's cursor, with the cookie.
  assert.equal(FakeSource.made[0].url, "/api/events?after=2.abababababababab");
  assert.deepEqual(FakeSource.made[0].init, { withCredentials: true });
  FakeSource.made[0].change("3.cdcdcdcdcdcdcdcd", { seq: 3, kind: "moment.create", upserted: ["m"], removed: [] });
  assert.equal(client.cursor, "3.cdcdcdcdcdcdcdcd");
  assert.deepEqual(changes, [3]);
  // The server comes back with another history: the browser's reconnect
  // is refused (the page sees only `error`); the client asks why.
  FakeSource.made[0].refused();
  await waitFor("a resync", () => resyncs.length === 1);
  assert.deepEqual(resyncs[0], { code: "cursor_unknown", after: "3.cdcdcdcdcdcdcdcd", head_cursor: "5.0101010101010101", head_seq: 5 });
  assert.equal(client.cursor, "5.0101010101010101");
  assert.equal(client.lastSeq, 5);
  assert.ok(asked.includes("GET /api/events"));
  // It reopens after the head the answer named, not after 3.
  await waitFor("a second stream", () => FakeSource.made.length === 2);
  assert.equal(FakeSource.made[1].url, "/api/events?after=5.0101010101010101");
  client.close();
});

test("a refusal that is not about the cursor changes nothing: the stream reopens from the same cursor", async () => {
  FakeSource.made = [];
  const engine = new FakeEngine(() => Date.now());
  engine.handle = async ({ path }) => {
    if (path === "/api/log/head") return new Response(JSON.stringify({ seq: 0, segment: "", chain: "00".repeat(32), cursor: "0" }), { status: 200, headers: { "content-type": "application/json" } });
    return problem(503, { code: "unavailable", status: 503 });
  };
  const client = await SparkClient.open({
    fetch: engine.fetch,
    indexedDB: new IDBFactory(),
    dbName: "spark-events-test-2",
    tabs: false,
    events: true,
    eventSource: FakeSource,
    autoSend: false,
    channelName: "events-test-2",
  });
  const resyncs = [];
  client.addEventListener("resync", (e) => resyncs.push(e.detail));
  await waitFor("a stream", () => FakeSource.made.length === 1);
  FakeSource.made[0].change("1.0a0a0a0a0a0a0a0a", { seq: 1, kind: "moment.create", upserted: ["m"], removed: [] });
  FakeSource.made[0].refused();
  await waitFor("a second stream", () => FakeSource.made.length === 2);
  assert.equal(resyncs.length, 0);
  assert.equal(FakeSource.made[1].url, "/api/events?after=1.0a0a0a0a0a0a0a0a");
  client.close();
});
