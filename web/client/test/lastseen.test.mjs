// The last-seen feed (LastSeen): saved and read back from another handle
// (a reload), its turns trimmed to those the moments name, and thumbnails
// dropped once their moment left the feed or fell past the newest
// LAST_SEEN_THUMBS_MAX.
import "fake-indexeddb/auto";
import { IDBFactory } from "fake-indexeddb";
import { test } from "node:test";
import assert from "node:assert/strict";
import { LastSeen, LAST_SEEN_THUMBS_MAX } from "../dist/index.js";

const moment = (id, turns = []) => ({ id, turns, media: [], version: 1, text: `text ${id}` });
const turn = (id) => ({ id, status: "done", mode: "practical" });
const thumb = (media_id, moment_id) => ({ media_id, moment_id, bytes: new Uint8Array([1, 2, 3]).buffer, content_type: "image/jpeg" });

test("a saved feed reads back from another handle, with only the turns its moments name", async () => {
  const factory = new IDBFactory();
  const store = await LastSeen.open("last-seen-test", factory);
  assert.equal(await store.read(), undefined, "nothing before a save");
  await store.save([moment("b", ["t2"]), moment("a", ["t1"])], [turn("t1"), turn("t2"), turn("t9")], 1234);
  store.close();
  const again = await LastSeen.open("last-seen-test", factory);
  const snapshot = await again.read();
  assert.equal(snapshot.saved_at_ms, 1234);
  assert.deepEqual(snapshot.moments.map((m) => m.id), ["b", "a"], "in feed order");
  assert.deepEqual(snapshot.turns.map((t) => t.id).sort(), ["t1", "t2"], "t9 is named by no moment");
  again.close();
});

test("a thumbnail whose moment left the feed is dropped at the next save; an empty feed leaves none", async () => {
  const store = await LastSeen.open("last-seen-test", new IDBFactory());
  await store.save([moment("b"), moment("a")], []);
  await store.putThumb(thumb("ma", "a"));
  await store.putThumb(thumb("mb", "b"));
  assert.deepEqual((await store.thumbIds()).sort(), ["ma", "mb"]);
  assert.deepEqual(new Uint8Array((await store.thumb("ma")).bytes), new Uint8Array([1, 2, 3]));
  // "a" was deleted (erased) on the engine: the feed no longer has it.
  await store.save([moment("b")], []);
  assert.deepEqual(await store.thumbIds(), ["mb"]);
  assert.equal(await store.thumb("ma"), undefined);
  // A sign-out empties the feed.
  await store.save([], []);
  assert.deepEqual(await store.thumbIds(), []);
  assert.deepEqual((await store.read()).moments, []);
  store.close();
});

test("thumbnails are kept for the newest LAST_SEEN_THUMBS_MAX moments only", async () => {
  const store = await LastSeen.open("last-seen-test", new IDBFactory());
  const ids = Array.from({ length: LAST_SEEN_THUMBS_MAX + 5 }, (_, i) => `m${String(1000 - i)}`);
  await store.save(ids.map((id) => moment(id)), []);
  for (const id of ids) await store.putThumb(thumb(`media-${id}`, id));
  await store.save(ids.map((id) => moment(id)), []);
  const kept = await store.thumbIds();
  assert.equal(kept.length, LAST_SEEN_THUMBS_MAX);
  assert.deepEqual(kept.sort(), ids.slice(0, LAST_SEEN_THUMBS_MAX).map((id) => `media-${id}`).sort(), "the newest, first in the feed");
  store.close();
});
