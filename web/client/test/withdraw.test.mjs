// Undo of a capture (SparkClient.withdrawEntry): removed with its media
// while the engine has acknowledged nothing of it; never after the
// moment's create was acknowledged; a create whose answer was lost is
// checked with the engine first; an undo during a request of the entry
// waits for its answer.
import { test } from "node:test";
import assert from "node:assert/strict";
import { setup, photo } from "./helpers.mjs";

test("an entry nothing of which was sent is undone with its media, and nothing is sent", async () => {
  const { client, engine } = await setup();
  const entry = await client.capture({ photo: photo() });
  assert.equal(await client.withdrawEntry(entry.id), "undone");
  assert.equal(await client.outbox.entry(entry.id), undefined);
  assert.equal(await client.outbox.bytes(entry.id, "copy"), undefined);
  assert.equal(await client.outbox.bytes(entry.id, "original"), undefined);
  await client.drainOnce();
  assert.equal(engine.log.length, 0, "nothing sent");
  assert.equal(await client.withdrawEntry(entry.id), "gone");
  client.close();
});

test("after the create was acknowledged the undo is refused and the rest is still sent", async () => {
  const { client, engine } = await setup();
  const entry = await client.capture({ photo: photo() });
  engine.script.push(undefined, () => new Error("link down"));
  await client.drainOnce();
  assert.deepEqual((await client.outbox.entry(entry.id)).done, ["create_moment"]);
  assert.equal(await client.withdrawEntry(entry.id), "acknowledged");
  assert.ok(await client.outbox.bytes(entry.id, "original"), "kept, with its media");
  await client.drainOnce();
  assert.equal((await client.outbox.entry(entry.id)).state, "done");
  client.close();
});

test("a create whose answer was lost: the engine is asked; the moment there means too late, none there means undone", async () => {
  const { client, engine } = await setup();
  // The create reached the engine; its answer was lost.
  const reached = await client.capture({ photo: photo("a") });
  engine.script.push(() => "drop");
  await client.drainOnce();
  assert.equal((await client.outbox.entry(reached.id)).create_unanswered, true);
  const before = engine.log.length;
  assert.equal(await client.withdrawEntry(reached.id), "acknowledged");
  assert.equal(engine.log.at(-1).path, `/api/moments/${reached.moment_id}`, "asked the engine");
  assert.equal(engine.log.length, before + 1);
  assert.ok(await client.outbox.entry(reached.id), "kept");
  // The create never reached it (the link failed before).
  const { client: other, engine: other_engine } = await setup();
  const lost = await other.capture({ photo: photo("b") });
  other_engine.script.push(() => new TypeError("Failed to fetch"));
  await other.drainOnce();
  assert.equal((await other.outbox.entry(lost.id)).create_unanswered, true);
  assert.equal(await other.withdrawEntry(lost.id), "undone");
  assert.equal(other_engine.moments.size, 0);
  // No answer to the question: nothing removed.
  const again = await other.capture({ photo: photo("c") });
  other_engine.script.push(() => new TypeError("Failed to fetch"), () => new TypeError("Failed to fetch"));
  await other.drainOnce();
  assert.equal(await other.withdrawEntry(again.id), "unknown");
  assert.ok(await other.outbox.entry(again.id));
  client.close();
  other.close();
});

test("an undo during the create's request waits for its answer, then finds it acknowledged", async () => {
  const { client, engine } = await setup();
  const entry = await client.capture({ photo: photo() });
  let release;
  const held = new Promise((r) => (release = r));
  engine.script.push(() => held);
  const pass = client.drainOnce();
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(engine.log.length, 1, "the create is in flight");
  assert.deepEqual(client.sendState.sending, { entry: entry.id, step: "create_moment" });
  let settled = false;
  const undo = client.withdrawEntry(entry.id).then((o) => ((settled = true), o));
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(settled, false, "the undo waits for the request in flight");
  release(undefined);
  assert.equal(await undo, "acknowledged");
  await pass;
  assert.equal(client.sendState.sending, null);
  assert.equal((await client.outbox.entry(entry.id)).state, "done", "the rest was sent");
  client.close();
});
