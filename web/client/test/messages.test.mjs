// Messages with ADR-036's rules (SPEC section 6), every rule a test:
// reuse within the margin, a fresh id past it, one fresh retry on a reused
// id's clock_skew (the ADR's own case), failed on a fresh id's clock_skew,
// a kept id keeps its ts, a retried message keeps its place.
import { test } from "node:test";
import assert from "node:assert/strict";
import { REUSE_MARGIN_MS, CLOCK_WINDOW_MS, ulidTime } from "../dist/index.js";
import { setup } from "./helpers.mjs";

const MIN = 60_000;
const THREAD = "01KB0000000000000000000000";

test("the margin is the window less one minute, from the OpenAPI document", () => {
  assert.equal(CLOCK_WINDOW_MS, 5 * MIN);
  assert.equal(REUSE_MARGIN_MS, 4 * MIN);
});

test("ADR-036's case: the page 2 minutes behind, a message pending 3.5 minutes: clock_skew, one fresh retry, accepted", async () => {
  const { client, engine, advance, pageClock } = await setup({ offsetMs: -2 * MIN });
  engine.script.push(() => new TypeError("Failed to fetch"));
  const first = await client.sendMessage(THREAD, "Bin gleich da");
  assert.equal(first.state, "pending");
  assert.equal(first.attempts, 1);
  advance(3.5 * MIN);
  // By the page's clock the id is 3.5 minutes old: under the margin, reused.
  const before = engine.log.length;
  const report = await client.drainOnce();
  assert.equal(report.wait, null);
  const sent = engine.log.slice(before).map((r) => JSON.parse(r.body).id);
  assert.equal(sent.length, 2, "the reused id, then one fresh one");
  assert.equal(sent[0], first.id, "the retry reused the id");
  assert.notEqual(sent[1], first.id);
  assert.equal(ulidTime(sent[1]), pageClock.now(), "the fresh id is from the page's clock");
  const [record, ...others] = await client.outbox.messages();
  assert.equal(others.length, 0, "the old record is gone");
  assert.equal(record.id, sent[1]);
  assert.equal(record.state, "sent");
  assert.equal(record.order, first.order);
  assert.equal(record.generation, 1);
  assert.equal(record.ts_from_server, true);
  assert.equal(record.ts, engine.messages.get(sent[1]).ts);
  assert.equal(engine.messages.size, 1);
  client.close();
});

test("a fresh id refused with clock_skew fails with a clock text, no second round (the page 6 minutes behind)", async () => {
  const { client, engine } = await setup({ offsetMs: -6 * MIN });
  const record = await client.sendMessage(THREAD, "Wo bist du?");
  assert.equal(engine.log.length, 1, "one request: no second round on a fresh id");
  assert.equal(record.state, "failed");
  assert.equal(record.error.code, "clock_skew");
  assert.match(record.error.detail, /clock is off by about 6\.0 minutes/);
  // A drain does not send a failed message.
  await client.drainOnce();
  assert.equal(engine.log.length, 1);
  // It keeps its place and its ts (the id's time).
  const [stored] = await client.outbox.messages();
  assert.equal(stored.ts, new Date(ulidTime(stored.id)).toISOString());
  assert.equal(stored.ts_from_server, false);
  client.close();
});

test("a retry within 4 minutes reuses the id and its record: a lost 202 makes no duplicate", async () => {
  const { client, engine, advance } = await setup({ offsetMs: 0 });
  engine.script.push(() => "drop");
  const first = await client.sendMessage(THREAD, "Hallo");
  assert.equal(first.state, "pending");
  assert.equal(engine.messages.size, 1, "the engine took it; the answer was lost");
  const pendingTs = (await client.outbox.message(first.id)).ts;
  assert.equal(pendingTs, new Date(ulidTime(first.id)).toISOString(), "display time follows the id while pending");
  advance(3 * MIN);
  await client.drainOnce();
  const bodies = engine.log.map((r) => JSON.parse(r.body).id);
  assert.deepEqual(bodies, [first.id, first.id]);
  const record = await client.outbox.message(first.id);
  assert.equal(record.state, "sent");
  assert.equal(record.generation, 0);
  assert.equal(engine.messages.size, 1);
  client.close();
});

test("past 4 minutes a fresh id is minted before the send; the old record is removed, the place kept", async () => {
  const { client, engine, advance, pageClock } = await setup();
  engine.script.push(() => new TypeError("offline"), () => new TypeError("offline"));
  const a = await client.sendMessage(THREAD, "eins");
  const b = await client.sendMessage(THREAD, "zwei");
  advance(4 * MIN + 1);
  await client.drainOnce();
  const sent = engine.log.slice(2).map((r) => JSON.parse(r.body));
  assert.deepEqual(sent.map((m) => m.body), ["eins", "zwei"], "in their order");
  for (const m of sent) {
    assert.ok(![a.id, b.id].includes(m.id), "fresh ids");
    assert.equal(ulidTime(m.id), pageClock.now());
  }
  const records = await client.outbox.messages();
  assert.deepEqual(records.map((r) => [r.body, r.order, r.state]), [
    ["eins", a.order, "sent"],
    ["zwei", b.order, "sent"],
  ]);
  assert.equal(await client.outbox.message(a.id), undefined);
  client.close();
});

test("a retried failed message goes again, with a fresh id once its own is past the margin, in its place; the others stay failed", async () => {
  const { client, engine, advance } = await setup({ offsetMs: -6 * MIN });
  const failed = await client.sendMessage(THREAD, "erst");
  const later = await client.sendMessage(THREAD, "dann");
  assert.equal(failed.state, "failed");
  assert.equal(later.state, "failed");
  // The person sets the clock; the engine's clock is now 6 minutes ahead
  // of the page's old one: the ids are 6 minutes old by the server.
  const { pageClock } = { pageClock: client.clock };
  pageClock.advance(6 * MIN);
  advance(0);
  await client.retryMessage(failed.id);
  const retried = await client.outbox.message(failed.id);
  assert.equal(retried.state, "pending");
  assert.equal(retried.error, null);
  await client.drainOnce();
  const records = await client.outbox.messages();
  assert.deepEqual(records.map((r) => [r.body, r.state]), [
    ["erst", "sent"],
    ["dann", "failed"],
  ]);
  assert.equal(records[0].order, failed.order, "keeps its place");
  client.close();
});

test("a message to a moment still in the outbox waits for the moment's create", async () => {
  const { client, engine } = await setup();
  engine.script.push(() => new TypeError("offline"));
  const entry = await client.capture({ photo: new Blob(["p"], { type: "image/png" }) });
  const message = await client.sendMessage(entry.moment_id, "zu diesem Schild");
  assert.equal(engine.log.length, 0, "nothing sent: the thread's moment is not on the engine yet");
  assert.equal(message.state, "pending");
  await client.drainOnce(); // offline: the create waits
  await client.drainOnce();
  const paths = engine.log.map((r) => r.path);
  assert.deepEqual(paths.slice(-5), ["/api/moments", `/api/media/${entry.photos[0].copy.id}`, `/api/moments/${entry.moment_id}/turns`, `/api/media/${entry.photos[0].original.id}`, "/api/messages"]);
  assert.equal((await client.outbox.message(message.id)).state, "sent");
  client.close();
});

test("a message sent at once and hit by a network error or a 503 is sent again after the backoff, not the idle pass", async () => {
  const { IDBFactory } = await import("fake-indexeddb");
  const { SparkClient, ManualClock } = await import("../dist/index.js");
  const { FakeEngine } = await import("./fake-engine.mjs");
  const clock = new ManualClock(Date.now());
  const engine = new FakeEngine(() => clock.now());
  const client = await SparkClient.open({
    fetch: engine.fetch,
    clock,
    indexedDB: new IDBFactory(),
    dbName: "spark-backoff",
    tabs: false,
    events: false,
    channelName: "test-backoff",
    backoff: { baseMs: 20, maxMs: 200, retryAfterMaxMs: 1000 },
  });
  try {
    // Let the first (empty) pass end: the loop is idle (its 30 s safety pass).
    await new Promise((r) => setTimeout(r, 50));
    const problem503 = () => new Response(JSON.stringify({ status: 503, code: "unavailable", detail: "later" }), { status: 503, headers: { "content-type": "application/problem+json" } });
    for (const trouble of [() => new TypeError("Failed to fetch"), problem503]) {
      engine.script.push(trouble);
      const start = Date.now();
      const record = await client.sendMessage(THREAD, `nach ${engine.log.length}`);
      assert.equal(record.state, "pending");
      for (let i = 0; i < 100 && engine.messages.size === 0; i++) await new Promise((r) => setTimeout(r, 20));
      assert.equal((await client.outbox.message(record.id))?.state, "sent", "sent again after the backoff");
      assert.ok(Date.now() - start < 1500, `sent after ${Date.now() - start} ms`);
      engine.messages.clear();
    }
  } finally {
    client.close();
  }
});
