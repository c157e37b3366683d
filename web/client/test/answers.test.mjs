// The answer classes of SPEC section 6: 2xx done; 401, 403, 408, 425, 429
// wait like a dropped link with Retry-After honoured; any other 4xx parks
// with the reason; 5xx and network errors back off with jitter.
import { test } from "node:test";
import assert from "node:assert/strict";
import { backoffDelay, classify, parseRetryAfter, statusClass, mintUlid, ulidTime, ManualClock, DEFAULT_BACKOFF } from "../dist/index.js";
import { setup, photo, answer } from "./helpers.mjs";

test("status classes", () => {
  for (const s of [200, 201, 202, 204]) assert.equal(statusClass(s), "done");
  for (const s of [401, 403, 408, 425, 429]) assert.equal(statusClass(s), "passing");
  for (const s of [400, 404, 405, 409, 410, 412, 413, 415, 421, 422]) assert.equal(statusClass(s), "permanent");
  for (const s of [500, 502, 503, 504, 507]) assert.equal(statusClass(s), "server");
});

test("Retry-After as seconds or an HTTP date", () => {
  const now = Date.UTC(2026, 11, 1, 12, 0, 0);
  assert.equal(parseRetryAfter("7", now), 7000);
  assert.equal(parseRetryAfter(new Date(now + 30_000).toUTCString(), now), 30_000);
  assert.equal(parseRetryAfter(new Date(now - 30_000).toUTCString(), now), 0, "a past date is no wait");
  assert.equal(parseRetryAfter("soon", now), undefined);
  assert.equal(parseRetryAfter(null, now), undefined);
});

for (const status of [401, 403, 408, 425, 429]) {
  test(`${status} waits like a dropped link, honouring Retry-After, and the entry stays pending`, async () => {
    const { client, engine } = await setup();
    const entry = await client.capture({ photo: photo() });
    engine.script.push(answer(status, "passing", { "retry-after": "12" }));
    const report = await client.drainOnce();
    assert.equal(report.wait.kind, "passing");
    assert.equal(report.wait.status, status);
    assert.equal(report.wait.retryAfterMs, 12_000);
    assert.equal(backoffDelay(report.wait, 5), 12_000, "Retry-After, not the backoff");
    const stored = await client.outbox.entry(entry.id);
    assert.equal(stored.state, "pending");
    assert.match(stored.last_error, new RegExp(`HTTP ${status}`));
    // Next pass: sent.
    await client.drainOnce();
    assert.equal((await client.outbox.entry(entry.id)).state, "done");
    client.close();
  });
}

for (const status of [400, 404, 409, 410, 413, 422]) {
  test(`${status} parks the entry with its reason`, async () => {
    const { client, engine } = await setup();
    const entry = await client.capture({ photo: photo() });
    engine.script.push(answer(status, `code_${status}`));
    const report = await client.drainOnce();
    assert.equal(report.wait, null);
    const stored = await client.outbox.entry(entry.id);
    assert.equal(stored.state, "parked");
    assert.deepEqual(stored.parked, { step: "create_moment", status, code: `code_${status}`, detail: `scripted ${status}` });
    // A parked entry is not sent again until retried.
    await client.drainOnce();
    assert.equal(engine.log.length, 1);
    client.close();
  });
}

for (const [name, script] of [
  ["503", answer(503, "unavailable")],
  ["500", answer(500, "unavailable")],
  ["a network error", () => new TypeError("Failed to fetch")],
]) {
  test(`${name} waits with backoff and the entry stays pending`, async () => {
    const { client, engine } = await setup();
    const entry = await client.capture({ photo: photo() });
    engine.script.push(script);
    const report = await client.drainOnce();
    assert.equal(report.wait.kind, name === "a network error" ? "link" : "server");
    assert.equal((await client.outbox.entry(entry.id)).state, "pending");
    client.close();
  });
}

test("backoff doubles to its cap, with jitter in the upper half", () => {
  const cause = { kind: "link", reason: "x" };
  const { baseMs, maxMs } = DEFAULT_BACKOFF;
  for (let n = 1; n <= 12; n++) {
    const d = Math.min(maxMs, baseMs * 2 ** (n - 1));
    assert.equal(backoffDelay(cause, n, DEFAULT_BACKOFF, () => 0), d / 2);
    assert.equal(backoffDelay(cause, n, DEFAULT_BACKOFF, () => 1), d);
    const r = backoffDelay(cause, n);
    assert.ok(r >= d / 2 && r <= d, `${r} within [${d / 2}, ${d}]`);
  }
  assert.equal(backoffDelay({ ...cause, retryAfterMs: 10 * 3_600_000 }, 1), DEFAULT_BACKOFF.retryAfterMaxMs, "a long Retry-After is cut");
});

test("classify reads the problem's code and detail", async () => {
  const v = await classify(new Response(JSON.stringify({ code: "conflict", detail: "other bytes" }), { status: 409 }), 0);
  assert.deepEqual(v.kind, "refused");
  assert.equal(v.refusal.code, "conflict");
  assert.equal(v.refusal.detail, "other bytes");
  const text = await classify(new Response("plain words", { status: 400 }), 0);
  assert.equal(text.refusal.detail, "plain words");
});

test("ids carry the page's clock, also after it steps back", () => {
  const clock = new ManualClock(Date.UTC(2026, 0, 1));
  const a = mintUlid(clock);
  const b = mintUlid(clock);
  assert.ok(a < b, "monotonic within a millisecond");
  assert.equal(ulidTime(b), clock.now());
  clock.advance(-6 * 60_000);
  assert.equal(ulidTime(mintUlid(clock)), clock.now());
});
