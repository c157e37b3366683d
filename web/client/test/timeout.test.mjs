// A request that is never answered (a hung engine, a link that dropped
// without a reset) ends after the client's timeout and counts as a lost
// answer: the link is "reconnecting", the retry sends the same ids, and
// the moment is made once (a newcomer saw "Sending the moment (1 of 4)…"
// forever with the engine stopped by SIGSTOP).
import { test } from "node:test";
import assert from "node:assert/strict";
import { DEFAULT_REQUEST_TIMEOUT_MS } from "../dist/index.js";
import { setup, photo } from "./helpers.mjs";

test("a request never answered times out, the link is reconnecting, and the retry makes the moment once", async () => {
  const { client, engine } = await setup({ options: { requestTimeoutMs: 100 } });
  const entry = await client.capture({ photo: photo("hung") });
  // The create reaches the engine, which commits it and never answers.
  engine.script.push(async (req) => {
    await engine.handle(req);
    return new Promise(() => {});
  });
  const started = Date.now();
  const first = await client.drainOnce();
  assert.ok(Date.now() - started < 2000, "the pass ended after the timeout");
  assert.equal(first.wait?.kind, "link");
  assert.match(first.wait.reason, /^network: no answer in/);
  assert.equal(client.link, "reconnecting");
  const stored = await client.outbox.entry(entry.id);
  assert.equal(stored.create_unanswered, true, "the create went out with no answer");
  assert.match(stored.last_error, /^network/);
  // The engine answers again: the same ids go again, one moment.
  const second = await client.drainOnce();
  assert.equal(second.wait, null);
  assert.equal(client.link, "online");
  const creates = engine.log.filter((r) => r.method === "POST" && r.path === "/api/moments");
  assert.equal(creates.length, 2);
  assert.equal(JSON.parse(creates[0].body).client_request_id, JSON.parse(creates[1].body).client_request_id);
  assert.equal(engine.moments.size, 1, "the moment is made once");
  assert.equal((await client.outbox.entry(entry.id)).state, "done");
  client.close();
});

test("an undo waiting on a request never answered ends once it times out", async () => {
  const { client, engine } = await setup({ options: { requestTimeoutMs: 100 } });
  const entry = await client.capture({ photo: photo("undo") });
  engine.script.push(() => new Promise(() => {}), () => new Promise(() => {}));
  const pass = client.drainOnce();
  await new Promise((r) => setTimeout(r, 20));
  // The create is in flight and then unanswered; the undo's question is unanswered too.
  assert.equal(await client.withdrawEntry(entry.id), "unknown");
  await pass;
  assert.ok(await client.outbox.entry(entry.id), "nothing removed on no answer");
  client.close();
});

test("a media upload's timeout grows with its size; the default for other requests is 20 s", async () => {
  assert.equal(DEFAULT_REQUEST_TIMEOUT_MS, 20_000);
  const { client, engine } = await setup({ options: { requestTimeoutMs: 50 } });
  let seen;
  engine.script.push(() => new Promise((resolve) => (seen = resolve)));
  // 32 KiB more is one second more: a 16 KiB body has 550 ms.
  const upload = client.request("PUT", "/api/media/X", new Uint8Array(16 * 1024), { "Content-Type": "image/jpeg" });
  await new Promise((r) => setTimeout(r, 200));
  seen(new Response(null, { status: 201 }));
  assert.equal((await upload).status, 201, "not timed out after 200 ms");
  client.close();
});
