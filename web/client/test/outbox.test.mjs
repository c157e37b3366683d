// Capture and the send of a capture (SPEC section 6): ids minted and the
// capture durable before any request; the seed's order; each step marked
// done and skipped on a retry; a lost answer repeated harmlessly.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Outbox, STEPS, sha256Hex } from "../dist/index.js";
import { setup, photo, answer } from "./helpers.mjs";

const ULID = /^[0-9A-HJKMNP-TV-Z]{26}$/;

test("capture mints every id and stores photo, copy and ids durably before any request", async () => {
  const { client, engine, factory } = await setup();
  const p = photo("Ausfahrt");
  const entry = await client.capture({ photo: p, text: "Ausfahrt freihalten", lang: "de" });
  assert.equal(engine.log.length, 0, "no request before capture returns");
  const ids = [entry.id, entry.moment_id, entry.turn_request_id, entry.photos[0].copy.id, entry.photos[0].original.id];
  for (const id of ids) assert.match(id, ULID);
  assert.equal(new Set(ids).size, 5, "every id distinct");
  assert.equal(entry.photos[0].original.sha256, await sha256Hex(await p.arrayBuffer()));
  assert.equal(entry.photos[0].copy.content_type, "image/jpeg");
  client.close();
  // Another handle on the same database (a reload) finds it all.
  const again = await Outbox.open("spark-test", factory);
  const [stored] = await again.entries();
  assert.deepEqual(stored, entry);
  assert.equal((await again.bytes(entry.id, "original")).byteLength, entry.photos[0].original.size);
  assert.equal((await again.bytes(entry.id, "copy")).byteLength, entry.photos[0].copy.size);
  again.close();
});

test("the send goes moment, copy, turn, original, and a done entry drops its bytes", async () => {
  const { client, engine } = await setup();
  const entry = await client.capture({ photo: photo() });
  const report = await client.drainOnce();
  assert.equal(report.wait, null);
  assert.deepEqual(
    engine.log.map((r) => `${r.method} ${r.path}`),
    [
      "POST /api/moments",
      `PUT /api/media/${entry.photos[0].copy.id}`,
      `POST /api/moments/${entry.moment_id}/turns`,
      `PUT /api/media/${entry.photos[0].original.id}`,
    ],
  );
  const [create, copy, turn, original] = engine.log;
  assert.deepEqual(JSON.parse(create.body).client_request_id, entry.id);
  assert.equal(JSON.parse(create.body).id, entry.moment_id);
  assert.equal(copy.headers["x-media-role"], "copy");
  assert.equal(copy.headers["x-content-sha256"], entry.photos[0].copy.sha256);
  assert.equal(copy.headers["x-moment-id"], entry.moment_id);
  assert.equal(JSON.parse(turn.body).client_request_id, entry.turn_request_id);
  assert.equal(JSON.parse(turn.body).mode, "practical");
  assert.equal(original.headers["x-media-role"], "original");
  const stored = await client.outbox.entry(entry.id);
  assert.equal(stored.state, "done");
  assert.deepEqual(stored.done, [...STEPS]);
  assert.equal(stored.turn_id, "T1");
  assert.equal(await client.outbox.bytes(entry.id, "original"), undefined);
  // Nothing more to send.
  await client.drainOnce();
  assert.equal(engine.log.length, 4);
  client.close();
});

test("a step done is skipped on the retry; a step whose answer was lost is repeated harmlessly", async () => {
  const { client, engine } = await setup();
  const entry = await client.capture({ photo: photo() });
  // The moment is created but its answer is lost; the copy gets a 503.
  engine.script.push(() => "drop");
  let report = await client.drainOnce();
  assert.equal(report.wait.kind, "link");
  assert.deepEqual((await client.outbox.entry(entry.id)).done, []);
  engine.script.push(undefined, answer(503, "unavailable"));
  report = await client.drainOnce();
  assert.equal(report.wait.kind, "server");
  assert.deepEqual((await client.outbox.entry(entry.id)).done, ["create_moment"]);
  const before = engine.log.length;
  report = await client.drainOnce();
  assert.equal(report.wait, null);
  assert.deepEqual(
    engine.log.slice(before).map((r) => r.path),
    [`/api/media/${entry.photos[0].copy.id}`, `/api/moments/${entry.moment_id}/turns`, `/api/media/${entry.photos[0].original.id}`],
    "the create is not sent again",
  );
  assert.equal(engine.moments.size, 1, "one moment for one capture");
  assert.equal(engine.log.filter((r) => r.path === "/api/moments").length, 2, "the lost create was sent once more, with its ids");
  client.close();
});

test("entries send in capture order, and a parked entry does not hold up the next", async () => {
  const { client, engine } = await setup();
  const a = await client.capture({ photo: photo("a") });
  const b = await client.capture({ photo: photo("b") });
  const c = await client.capture({ photo: photo("c") });
  // b's copy is refused for good.
  engine.script.push(undefined, undefined, undefined, undefined, undefined, answer(409, "conflict"));
  const report = await client.drainOnce();
  assert.equal(report.wait, null);
  const creates = engine.log.filter((r) => r.path === "/api/moments").map((r) => JSON.parse(r.body).id);
  assert.deepEqual(creates, [a.moment_id, b.moment_id, c.moment_id]);
  const parked = await client.outbox.entry(b.id);
  assert.equal(parked.state, "parked");
  assert.deepEqual(parked.parked, { step: "upload_copy", photo: 0, status: 409, code: "conflict", detail: "scripted 409" });
  assert.equal((await client.outbox.entry(c.id)).state, "done");
  // Retried by the person: the done step stays done.
  await client.retryEntry(b.id);
  const before = engine.log.length;
  await client.drainOnce();
  assert.equal(engine.log[before].path, `/api/media/${b.photos[0].copy.id}`);
  assert.equal((await client.outbox.entry(b.id)).state, "done");
  client.close();
});

test("ready: once storage is open and the outbox loaded, as an event after open() and as a promise", async () => {
  const { client } = await setup();
  let heard = 0;
  client.addEventListener("ready", () => heard++);
  await client.ready;
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(heard, 1);
  client.close();
});

test("every JSON body is declared application/json, a string one too; media keep their own type", async () => {
  const { client, engine } = await setup();
  const entry = await client.capture({ photo: photo() });
  await client.drainOnce();
  await client.sendMessage(entry.moment_id, "what does it mean?");
  await client.drainOnce();
  const types = engine.log.map((r) => `${r.method} ${r.path.replace(/[0-9A-Z]{26}/g, "{id}")} ${r.headers["content-type"]}`);
  assert.deepEqual(types, [
    "POST /api/moments application/json",
    "PUT /api/media/{id} image/jpeg",
    "POST /api/moments/{id}/turns application/json",
    "PUT /api/media/{id} image/png",
    "POST /api/messages application/json",
  ]);
  // A JSON text the caller made is JSON too (a browser would call it text/plain);
  // a type the caller names is kept, and the engine refuses what is not JSON.
  const made = await client.request("POST", "/api/moments", JSON.stringify({ id: entry.moment_id, client_request_id: entry.id }));
  assert.equal(made.status, 200);
  assert.equal(engine.log.at(-1).headers["content-type"], "application/json");
  const plain = await client.request("POST", "/api/moments", "{}", { "Content-Type": "text/plain" });
  assert.equal(plain.status, 415);
  assert.equal((await plain.json()).code, "unsupported_media_type");
  client.close();
});

test("a done entry keeps its ids, not its text, caption or lang; one an earlier build kept is scrubbed at open", async () => {
  const { client, factory } = await setup();
  const entry = await client.capture({ photo: photo(), text: "WINDOWTEXT", caption: "WINDOWCAPTION", lang: "de" });
  assert.equal((await client.outbox.entry(entry.id)).text, "WINDOWTEXT", "kept while it is to send");
  await client.drainOnce();
  const stored = await client.outbox.entry(entry.id);
  assert.equal(stored.state, "done");
  assert.deepEqual([stored.text, stored.caption, stored.lang], [null, null, null]);
  assert.equal(stored.moment_id, entry.moment_id);
  assert.equal(await client.withdrawEntry(entry.id), "acknowledged", "an undo still knows it was sent");
  // A done entry as an earlier build stored it, with its content.
  await client.outbox.db.put("entries", { ...stored, id: "01KBN00000000000000000000Z", text: "OLDTEXT", caption: "OLDCAPTION", lang: "en" });
  client.close();
  const again = await Outbox.open("spark-test", factory);
  for (const kept of await again.entries()) {
    assert.deepEqual([kept.text, kept.caption, kept.lang], [null, null, null], kept.id);
  }
  again.close();
});

test("forgetMoment drops the done entries and sent messages of a deleted moment and keeps what is still to send", async () => {
  const { client, engine } = await setup();
  const gone = await client.capture({ photo: photo("gone"), text: "gone" });
  const kept = await client.capture({ photo: photo("kept"), text: "kept" });
  await client.drainOnce();
  const said = await client.sendMessage(gone.moment_id, "WINDOWMESSAGE");
  assert.equal((await client.outbox.message(said.id)).state, "sent");
  const other = await client.sendMessage(kept.moment_id, "stays");
  // One still to send for the deleted moment: the engine drops the link.
  engine.script.push(() => new TypeError("Failed to fetch"));
  const waiting = await client.sendMessage(gone.moment_id, "not yet sent");
  assert.equal((await client.outbox.message(waiting.id)).state, "pending");
  await client.outbox.forgetMoment(gone.moment_id);
  assert.deepEqual((await client.outbox.entries()).map((e) => e.id), [kept.id]);
  assert.deepEqual(
    (await client.outbox.messages()).map((m) => m.id).sort(),
    [other.id, waiting.id].sort(),
  );
  client.close();
});
