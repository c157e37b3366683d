// Several photos per moment (issue 27): a capture of up to 10 photos, each
// a copy and an original uploaded with its `X-Photo` number and a media id
// minted at capture; the copies before the turn (the brain reads them all,
// in photo order), the originals after it; every upload once, a retry
// skipping what is done; a parked upload says which photo; an undo takes
// every photo's bytes; and entries stored by the build before (one copy,
// one original) still send after the upgrade, as photo 0.
import { test } from "node:test";
import assert from "node:assert/strict";
import { openDB } from "idb";
import { MAX_JSON_BODY_BYTES, MAX_PHOTOS, Outbox, entrySteps, normaliseEntry, sha256Hex } from "../dist/index.js";
import { setup, photo, answer } from "./helpers.mjs";

const ULID = /^[0-9A-HJKMNP-TV-Z]{26}$/;
const three = () => [{ photo: photo("eins") }, { photo: photo("zwei") }, { photo: photo("drei") }];

/** How many records the outbox's blobs store holds. */
async function blobCount(client) {
  return client.outbox.db.count("blobs");
}

test("a capture of three photos mints every id at capture and stores each photo's copy and original durably", async () => {
  const { client, engine, factory } = await setup();
  const inputs = three();
  const entry = await client.capture({ photos: inputs, text: "drei Fotos" });
  assert.equal(engine.log.length, 0, "no request before capture returns");
  assert.deepEqual(entry.photos.map((p) => p.photo), [0, 1, 2]);
  const ids = [entry.id, entry.moment_id, entry.turn_request_id, ...entry.photos.flatMap((p) => [p.copy.id, p.original.id])];
  for (const id of ids) assert.match(id, ULID);
  assert.equal(new Set(ids).size, 9, "every id distinct");
  for (const [i, p] of entry.photos.entries()) {
    assert.equal(p.original.sha256, await sha256Hex(await inputs[i].photo.arrayBuffer()));
    assert.equal(p.copy.content_type, "image/jpeg");
  }
  assert.equal(await blobCount(client), 6);
  client.close();
  const again = await Outbox.open("spark-test", factory);
  assert.deepEqual(await again.entry(entry.id), entry);
  for (const p of entry.photos) {
    assert.equal((await again.bytes(entry.id, "copy", p.photo)).byteLength, p.copy.size);
    assert.equal((await again.bytes(entry.id, "original", p.photo)).byteLength, p.original.size);
  }
  again.close();
});

test("the send goes moment, every copy in photo order, turn, every original, each with its X-Photo; the engine has each photo once", async () => {
  const { client, engine } = await setup();
  const entry = await client.capture({ photos: three() });
  const report = await client.drainOnce();
  assert.equal(report.wait, null);
  const [p0, p1, p2] = entry.photos;
  assert.deepEqual(
    engine.log.map((r) => `${r.method} ${r.path} ${r.headers["x-media-role"] ?? ""}${r.headers["x-photo"] ?? ""}`.trim()),
    [
      "POST /api/moments",
      `PUT /api/media/${p0.copy.id} copy0`,
      `PUT /api/media/${p1.copy.id} copy1`,
      `PUT /api/media/${p2.copy.id} copy2`,
      `POST /api/moments/${entry.moment_id}/turns`,
      `PUT /api/media/${p0.original.id} original0`,
      `PUT /api/media/${p1.original.id} original1`,
      `PUT /api/media/${p2.original.id} original2`,
    ],
  );
  const moment = engine.moments.get(entry.moment_id);
  assert.deepEqual(moment.media.map((m) => `${m.role}${m.photo}`), ["copy0", "copy1", "copy2", "original0", "original1", "original2"]);
  const stored = await client.outbox.entry(entry.id);
  assert.equal(stored.state, "done");
  assert.deepEqual(stored.done, entrySteps(entry).map((s) => s.key));
  assert.deepEqual(stored.done, ["create_moment", "upload_copy", "upload_copy:1", "upload_copy:2", "start_turn", "upload_original", "upload_original:1", "upload_original:2"]);
  assert.equal(await blobCount(client), 0, "a done entry drops every photo's bytes");
  await client.drainOnce();
  assert.equal(engine.log.length, 8, "nothing more to send");
  client.close();
});

test("a capture of one photo sends as before, as photo 0", async () => {
  const { client, engine } = await setup();
  const entry = await client.capture({ photo: photo() });
  assert.equal(entry.photos.length, 1);
  await client.drainOnce();
  assert.deepEqual(engine.log.filter((r) => r.method === "PUT").map((r) => r.headers["x-photo"]), ["0", "0"]);
  assert.deepEqual(engine.moments.get(entry.moment_id).media.map((m) => m.photo), [0, 0]);
  assert.deepEqual((await client.outbox.entry(entry.id)).done, ["create_moment", "upload_copy", "start_turn", "upload_original"]);
  client.close();
});

test("an upload whose answer was lost is repeated with its id (200, nothing twice); a step done is skipped; the request in flight names its photo", async () => {
  const { client, engine } = await setup();
  const entry = await client.capture({ photos: three() });
  // The create and copy 0 go; copy 1 reaches the engine but its answer is lost.
  let inFlight = null;
  engine.script.push(undefined, undefined, () => {
    inFlight = client.sendState.sending;
    return "drop";
  });
  let report = await client.drainOnce();
  assert.equal(report.wait.kind, "link");
  assert.deepEqual(inFlight, { entry: entry.id, step: "upload_copy", photo: 1 });
  assert.deepEqual((await client.outbox.entry(entry.id)).done, ["create_moment", "upload_copy"]);
  const before = engine.log.length;
  report = await client.drainOnce();
  assert.equal(report.wait, null);
  const [p0, p1, p2] = entry.photos;
  assert.deepEqual(
    engine.log.slice(before).map((r) => r.path),
    [`/api/media/${p1.copy.id}`, `/api/media/${p2.copy.id}`, `/api/moments/${entry.moment_id}/turns`, `/api/media/${p0.original.id}`, `/api/media/${p1.original.id}`, `/api/media/${p2.original.id}`],
    "the create and copy 0 are not sent again",
  );
  assert.equal(engine.moments.size, 1);
  assert.equal(engine.media.size, 6, "six media, each stored once");
  assert.equal(engine.moments.get(entry.moment_id).media.length, 6);
  assert.equal((await client.outbox.entry(entry.id)).state, "done");
  client.close();
});

test("a refused upload parks the entry with the step and the photo; Retry goes on from there", async () => {
  const { client, engine } = await setup();
  const entry = await client.capture({ photos: three() });
  // create, 3 copies, turn, original 0 go; original 1 is refused (too big).
  engine.script.push(undefined, undefined, undefined, undefined, undefined, undefined, answer(413, "payload_too_large"));
  await client.drainOnce();
  const parked = await client.outbox.entry(entry.id);
  assert.equal(parked.state, "parked");
  assert.deepEqual(parked.parked, { step: "upload_original", photo: 1, status: 413, code: "payload_too_large", detail: "scripted 413" });
  assert.ok(await client.outbox.bytes(entry.id, "original", 1), "its bytes are kept for a retry");
  await client.retryEntry(entry.id);
  const before = engine.log.length;
  await client.drainOnce();
  assert.deepEqual(engine.log.slice(before).map((r) => `${r.path} ${r.headers["x-photo"]}`), [`/api/media/${entry.photos[1].original.id} 1`, `/api/media/${entry.photos[2].original.id} 2`]);
  assert.equal((await client.outbox.entry(entry.id)).state, "done");
  client.close();
});

test("the fake engine as the real one: 409 conflict media_role for another media id in a photo's role; a bad X-Photo is 400", async () => {
  const { client, engine } = await setup();
  const entry = await client.capture({ photos: three() });
  await client.drainOnce();
  const bytes = new Uint8Array([1, 2, 3]);
  const other = await client.request("PUT", "/api/media/01KBN0000000000000000000AA", bytes, { "X-Moment-Id": entry.moment_id, "X-Media-Role": "copy", "X-Photo": "1", "Content-Type": "image/jpeg" });
  assert.equal(other.status, 409);
  const problem = await other.json();
  assert.deepEqual([problem.code, problem.conflict, problem.photo, problem.media_id], ["conflict", "media_role", 1, entry.photos[1].copy.id]);
  for (const bad of ["10", "-1", "x", "", " 1", "1000"]) {
    const refused = await client.request("PUT", "/api/media/01KBN0000000000000000000AB", bytes, { "X-Moment-Id": entry.moment_id, "X-Media-Role": "copy", "X-Photo": bad, "Content-Type": "image/jpeg" });
    assert.equal(refused.status, 400, bad);
    assert.equal((await refused.json()).code, "invalid_request");
  }
  assert.equal(engine.media.size, 6);
  client.close();
});

test("an undo takes a capture of three photos out with every photo's bytes, and nothing is sent", async () => {
  const { client, engine } = await setup();
  const kept = await client.capture({ photo: photo("bleibt") });
  const entry = await client.capture({ photos: three() });
  assert.equal(await blobCount(client), 8);
  assert.equal(await client.withdrawEntry(entry.id), "undone");
  assert.equal(await client.outbox.entry(entry.id), undefined);
  assert.equal(await blobCount(client), 2, "only the other capture's bytes are left");
  assert.ok(await client.outbox.bytes(kept.id, "copy"));
  await client.drainOnce();
  assert.ok(!engine.log.some((r) => r.method === "POST" && r.path === "/api/moments" && JSON.parse(r.body).id === entry.moment_id), "nothing of it sent");
  client.close();
});

test("up to 10 photos: 10 are taken, 11 or none are refused and nothing is stored", async () => {
  const { client } = await setup();
  assert.equal(MAX_PHOTOS, 10);
  const ten = Array.from({ length: 10 }, (_, i) => ({ photo: photo(`p${i}`) }));
  const entry = await client.capture({ photos: ten });
  assert.deepEqual(entry.photos.map((p) => p.photo), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
  await assert.rejects(client.capture({ photos: [...ten, { photo: photo("p10") }] }), /at most 10 photos/);
  await assert.rejects(client.capture({ photos: [] }), /needs a photo/);
  await assert.rejects(client.capture({}), /needs a photo/);
  await assert.rejects(client.capture({ photo: photo(), photos: ten }), /not both/);
  assert.equal((await client.outbox.entries()).length, 1);
  assert.equal(await blobCount(client), 20);
  client.close();
});

test("a text too long for the engine's JSON body is refused at capture, before anything is stored; one that fits is sent", async () => {
  const { client, engine } = await setup();
  assert.equal(MAX_JSON_BODY_BYTES, 65_536);
  await assert.rejects(client.capture({ photo: photo(), text: "Ausfahrt freihalten ".repeat(5000) }), /the text is too long for one moment \(100\d{3} bytes; the engine takes at most 65024\)/);
  // Escapes count (10,000 quotes are 20,002 bytes of JSON: 10,000 bytes would fit), and so does the caption.
  await assert.rejects(client.capture({ photo: photo(), text: "\"".repeat(10_000), caption: "x".repeat(45_100) }), /too long/);
  assert.equal((await client.outbox.entries()).length, 0, "nothing stored");
  assert.equal(await blobCount(client), 0);
  const fits = await client.capture({ photo: photo(), text: "ä".repeat(32_000) });
  await client.drainOnce();
  assert.equal((await client.outbox.entry(fits.id)).state, "done");
  assert.equal(engine.moments.get(fits.moment_id)?.text?.length, 32_000);
  client.close();
  const { client: small } = await setup({ options: { maxJsonBodyBytes: 2048 } });
  await assert.rejects(small.capture({ photo: photo(), text: "x".repeat(1600) }), /at most 1536\)/);
  small.close();
});

test("forgetMoment drops a deleted moment's done capture of several photos", async () => {
  const { client } = await setup();
  const entry = await client.capture({ photos: three() });
  await client.drainOnce();
  await client.outbox.forgetMoment(entry.moment_id);
  assert.deepEqual(await client.outbox.entries(), []);
  client.close();
});

/** The outbox database as the build before several photos made and filled it: entries with one copy and one original, bytes under `<entry>:<role>`. */
async function oldBuildOutbox(factory, entries) {
  const previous = globalThis.indexedDB;
  globalThis.indexedDB = factory;
  try {
    const db = await openDB("spark-test", 1, {
      upgrade(db) {
        db.createObjectStore("entries", { keyPath: "id" });
        db.createObjectStore("blobs", { keyPath: "key" });
        db.createObjectStore("messages", { keyPath: "id" }).createIndex("order", "order");
      },
    });
    for (const { entry, copy, original } of entries) {
      await db.put("entries", entry);
      await db.put("blobs", { key: `${entry.id}:copy`, bytes: copy });
      await db.put("blobs", { key: `${entry.id}:original`, bytes: original });
    }
    db.close();
  } finally {
    globalThis.indexedDB = previous;
  }
}

/** An entry as the build before several photos stored it. */
async function oldEntry(n, done, extra = {}) {
  const copy = new TextEncoder().encode(`old copy ${n}`).buffer;
  const original = new TextEncoder().encode(`old original ${n} ${"x".repeat(40)}`).buffer;
  const id = (i) => `01KBN00000000000000000${n}${i}0`;
  const entry = {
    id: id(0),
    moment_id: id(1),
    turn_request_id: id(2),
    text: `alt ${n}`,
    caption: null,
    lang: null,
    captured_at: "2026-12-01T11:00:00.000Z",
    copy: { id: id(3), content_type: "image/jpeg", size: copy.byteLength, sha256: await sha256Hex(copy) },
    original: { id: id(4), content_type: "image/png", size: original.byteLength, sha256: await sha256Hex(original) },
    done,
    state: "pending",
    parked: null,
    turn_id: null,
    last_error: null,
    ...extra,
  };
  return { entry, copy, original };
}

test("entries stored by the build before several photos are read as photo 0 after the upgrade, and sent once", async () => {
  const { IDBFactory } = await import("fake-indexeddb");
  const factory = new IDBFactory();
  // One untouched, one half sent (moment and copy done), one parked on its original.
  const fresh = await oldEntry(1, []);
  const half = await oldEntry(2, ["create_moment", "upload_copy"]);
  const parked = await oldEntry(3, ["create_moment", "upload_copy", "start_turn"], { state: "parked", parked: { step: "upload_original", status: 413, code: "payload_too_large", detail: "too big" } });
  await oldBuildOutbox(factory, [fresh, half, parked]);
  const { client, engine } = await setup({ factory });
  // The engine has what the old build sent of the half-sent and the parked one.
  for (const old of [half, parked]) {
    engine.moments.set(old.entry.moment_id, { id: old.entry.moment_id, text: old.entry.text, media: [], turns: [] });
    engine.requests.set(old.entry.id, engine.moments.get(old.entry.moment_id));
    const copy = { id: old.entry.copy.id, moment_id: old.entry.moment_id, role: "copy", photo: 0, sha256: old.entry.copy.sha256, size: old.entry.copy.size };
    engine.media.set(copy.id, copy);
    engine.moments.get(old.entry.moment_id).media.push(copy);
  }
  // Rewritten at open: photos, no copy or original, every other field as it was.
  const raw = await client.outbox.db.get("entries", half.entry.id);
  assert.equal(raw.copy, undefined);
  assert.equal(raw.original, undefined);
  assert.deepEqual(raw.photos, [{ photo: 0, copy: half.entry.copy, original: half.entry.original }]);
  assert.deepEqual(raw.done, ["create_moment", "upload_copy"]);
  assert.equal((await client.outbox.bytes(half.entry.id, "original", 0)).byteLength, half.entry.original.size, "its bytes are photo 0's");

  await client.drainOnce();
  const sent = engine.log.map((r) => `${r.method} ${r.path} ${r.headers["x-photo"] ?? ""}`.trim());
  assert.deepEqual(sent, [
    "POST /api/moments",
    `PUT /api/media/${fresh.entry.copy.id} 0`,
    `POST /api/moments/${fresh.entry.moment_id}/turns`,
    `PUT /api/media/${fresh.entry.original.id} 0`,
    `POST /api/moments/${half.entry.moment_id}/turns`,
    `PUT /api/media/${half.entry.original.id} 0`,
  ], "what the old build did is not sent again; the parked one waits");
  for (const old of [fresh, half]) assert.equal((await client.outbox.entry(old.entry.id)).state, "done");
  // The parked one: its reason says photo 0 once read; Retry sends its original.
  const stillParked = await client.outbox.entry(parked.entry.id);
  assert.equal(stillParked.state, "parked");
  assert.equal(stillParked.parked.photo ?? 0, 0);
  await client.retryEntry(parked.entry.id);
  await client.drainOnce();
  assert.equal(engine.log.at(-1).path, `/api/media/${parked.entry.original.id}`);
  assert.equal(engine.log.at(-1).headers["x-photo"], "0");
  assert.equal((await client.outbox.entry(parked.entry.id)).state, "done");
  assert.equal(await blobCount(client), 0);
  for (const old of [fresh, half, parked]) {
    assert.deepEqual(engine.moments.get(old.entry.moment_id).media.map((m) => `${m.role}${m.photo}`).sort(), ["copy0", "original0"]);
  }
  client.close();
});

test("an entry of the old shape written after the outbox opened (an old tab) is still read as photo 0", async () => {
  const { client, engine } = await setup();
  const old = await oldEntry(4, []);
  await client.outbox.db.put("entries", old.entry);
  await client.outbox.db.put("blobs", { key: `${old.entry.id}:copy`, bytes: old.copy });
  await client.outbox.db.put("blobs", { key: `${old.entry.id}:original`, bytes: old.original });
  const [read] = await client.outbox.entries();
  assert.deepEqual(read.photos, [{ photo: 0, copy: old.entry.copy, original: old.entry.original }]);
  assert.deepEqual(normaliseEntry(read), read, "a new-shape entry is left as it is");
  await client.drainOnce();
  assert.equal(engine.moments.get(old.entry.moment_id).media.length, 2);
  assert.equal((await client.outbox.entry(old.entry.id)).state, "done");
  assert.equal(await blobCount(client), 0);
  client.close();
});
