// Several photos per moment (issue 27, item 2): the capture form takes
// several photos into a preview strip (each removable, from the keyboard
// too), up to 10 (more, or a bad file, refused with a reason keeping what
// was typed and chosen); Save makes one moment whose photos the engine
// holds in order (`X-Photo` 0, 1, ...), each copy and original uploaded
// once; the feed shows photo 0, the moment's view every photo in order. A
// capture of several photos made with the engine stopped is sent once
// when it is back, also through a link that drops every second answer; a
// parked upload says which photo; and an undo of a Save of three photos
// leaves nothing on the engine.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import path from "node:path";
import { NO_OCR, api, browserOrSkip, countKinds, idbCounts, launch, lossyProxy, noisePng, openMoment, openPage, opKinds, outDir, photoPng, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();
// No reading is awaited here: OCR off keeps the brain's work (every copy read) out of the way.
const sha = (bytes) => createHash("sha256").update(bytes).digest("hex");
const png = (name, seed, w = 480, h = 360) => ({ name, mimeType: "image/png", buffer: photoPng(w, h, seed) });

/** Every media upload the page makes, as the engine answered it: `{ id, role, photo, status }`. */
function uploads(page) {
  const seen = [];
  page.on("response", (r) => {
    const req = r.request();
    if (req.method() !== "PUT" || !req.url().includes("/api/media/")) return;
    const h = req.headers();
    seen.push({ id: new URL(req.url()).pathname.split("/").pop(), role: h["x-media-role"], photo: h["x-photo"], status: r.status() });
  });
  return seen;
}

/** The moment's media as `<role><photo>` in the engine's order (upload order). */
const shape = (moment) => moment.media.map((m) => `${m.role}${m.photo}`);

test("three photos chosen, one removed from the keyboard, Save: one moment with photos 0 and 1 in order, each uploaded once; the feed shows photo 0, the moment both", { skip, timeout: 180_000 }, async () => {
  const engine = await startEngine({ config: NO_OCR });
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    const sent = uploads(page);
    assert.equal(await page.getAttribute("#capture-file", "capture"), "environment", "the camera on phones");
    assert.equal(await page.getAttribute("#capture-file", "multiple"), "", "several photos from the camera input too");
    const [eins, zwei, drei] = [png("eins.png", 201), png("zwei.png", 202), png("drei.png", 203)];
    await page.setInputFiles("#capture-pick", [eins, zwei, drei]);
    await until(async () => (await page.locator("#capture-preview img").count()) === 3, "three previews");
    assert.equal(await page.textContent("#capture-save"), "Save 3 photos");
    assert.match(await page.textContent("#capture-several"), /3 photos, saved as one moment in this order/);
    await page.fill("#capture-text", "drei, dann zwei");
    await page.screenshot({ path: path.join(outDir, "photos-strip.png") });
    // Photo 2 removed from the keyboard: the focus moves to the next photo's Remove.
    await page.focus('#capture-preview button[aria-label="Remove photo 2 (zwei.png)"]');
    await page.keyboard.press("Enter");
    await until(async () => (await page.locator("#capture-preview img").count()) === 2, "two previews left");
    assert.deepEqual(await page.locator("#capture-preview img").evaluateAll((imgs) => imgs.map((i) => i.alt)), ["photo 1 of 2: eins.png", "photo 2 of 2: drei.png"]);
    assert.equal(await page.evaluate(() => document.activeElement?.getAttribute("aria-label")), "Remove photo 2 (drei.png)", "the focus stays in the strip");
    assert.equal(await page.inputValue("#capture-text"), "drei, dann zwei", "the text stays");
    assert.deepEqual(sent, [], "nothing sent before Save");
    await page.click("#capture-save");

    const row = page.locator("#feed [data-moment-id]");
    await until(async () => (await row.count()) === 1 && (await page.locator("#feed [data-outbox]").count()) === 0, "the moment, sent");
    const id = await row.getAttribute("data-moment-id");
    await until(async () => (await api(engine.base, `/api/moments/${id}`)).media.length === 4, "both originals", 60_000);
    const moment = await api(engine.base, `/api/moments/${id}`);
    assert.equal(moment.text, "drei, dann zwei");
    assert.deepEqual(shape(moment), ["copy0", "copy1", "original0", "original1"], "the copies (in photo order) before the originals");
    const original = (n) => moment.media.find((m) => m.role === "original" && m.photo === n);
    assert.equal(original(0).sha256, sha(eins.buffer), "photo 0 is the first chosen");
    assert.equal(original(1).sha256, sha(drei.buffer), "photo 1 is the third (the second was removed)");
    assert.ok(!moment.media.some((m) => m.sha256 === sha(zwei.buffer)), "the removed photo was not sent");
    // Each upload once, each with its photo's number.
    assert.deepEqual(sent.map((u) => `${u.role}${u.photo} ${u.status}`), ["copy0 201", "copy1 201", "original0 201", "original1 201"]);
    assert.deepEqual(sent.map((u) => u.id).sort(), moment.media.map((m) => m.id).sort());
    const counts = countKinds(await opKinds(engine.base));
    assert.equal(counts["moment.create"], 1);
    assert.equal(counts["media.put"], 4);
    assert.equal(counts["turn.start"], 1);

    // The feed shows photo 0's copy and says how many photos.
    const copy0 = moment.media.find((m) => m.role === "copy" && m.photo === 0);
    const copy1 = moment.media.find((m) => m.role === "copy" && m.photo === 1);
    assert.equal(new URL(await row.locator("img").getAttribute("src"), engine.base).pathname, `/api/media/${copy0.id}`);
    assert.match(await row.textContent(), /2 photos/);
    // The moment: both copies, in photo order, each drawn.
    await openMoment(page, id);
    const shown = page.locator("#moment .photos img");
    await until(async () => (await shown.count()) === 2, "both photos in the moment");
    assert.deepEqual(
      (await shown.evaluateAll((imgs) => imgs.map((i) => new URL(i.src).pathname))),
      [`/api/media/${copy0.id}`, `/api/media/${copy1.id}`],
    );
    await page.waitForFunction(() => [...document.querySelectorAll("#moment .photos img")].every((i) => i.complete && i.naturalWidth > 0));
    assert.deepEqual(await shown.evaluateAll((imgs) => imgs.map((i) => i.alt)), ["photo 1 of 2", "photo 2 of 2"]);
    assert.match(await page.textContent("#moment .muted"), /2 photos/);
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: path.join(outDir, "photos-moment.png"), fullPage: true });
  } finally {
    await context.close();
    await engine.stop();
  }
});

test("up to 10 photos: more are refused with the reason, a bad file too, keeping the text and the photos chosen; Save sends photos 0 to 9", { skip, timeout: 180_000 }, async () => {
  const engine = await startEngine({ config: NO_OCR });
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    const sent = uploads(page);
    await page.fill("#capture-text", "zehn Fotos");
    const files = Array.from({ length: 12 }, (_, i) => png(`foto${i + 1}.png`, 300 + i, 96, 72));
    await page.setInputFiles("#capture-pick", files.slice(0, 8));
    await until(async () => (await page.locator("#capture-preview img").count()) === 8, "eight previews");
    // Four more and a file that is no photo: two fit, two are over, the text file is no photo.
    await page.setInputFiles("#capture-pick", [...files.slice(8), { name: "notiz.txt", mimeType: "text/plain", buffer: Buffer.from("hallo") }]);
    await until(async () => (await page.textContent("#capture-error")).includes("notiz.txt"), "the refusal said");
    const error = await page.textContent("#capture-error");
    assert.match(error, /“foto11\.png”, “foto12\.png”: a moment holds at most 10 photos/);
    assert.match(error, /“notiz\.txt” is not a photo/);
    assert.match(error, /What you typed and the photos chosen are kept/);
    assert.equal(await page.locator("#capture-preview img").count(), 10, "the ten chosen stay");
    assert.equal(await page.inputValue("#capture-text"), "zehn Fotos");
    assert.match(await page.textContent("#capture-several"), /the most one moment holds/);
    assert.deepEqual(sent, []);
    await page.click("#capture-save");
    const row = page.locator("#feed [data-moment-id]");
    await until(async () => (await row.count()) === 1, "the moment");
    const id = await row.getAttribute("data-moment-id");
    await until(async () => (await api(engine.base, `/api/moments/${id}`)).media.length === 20, "every photo", 90_000);
    const moment = await api(engine.base, `/api/moments/${id}`);
    const numbers = Array.from({ length: 10 }, (_, i) => i);
    assert.deepEqual(shape(moment), [...numbers.map((n) => `copy${n}`), ...numbers.map((n) => `original${n}`)]);
    for (const n of numbers) assert.equal(moment.media.find((m) => m.role === "original" && m.photo === n).sha256, sha(files[n].buffer), `photo ${n}`);
    assert.equal(sent.length, 20, "each once");
    assert.ok(sent.every((u) => u.status === 201));
  } finally {
    await context.close();
    await engine.stop();
  }
});

test("a capture of three photos made with the engine stopped is sent exactly once when it is back, through a link that drops every second answer", { skip, timeout: 240_000 }, async () => {
  let engine = await startEngine({ config: NO_OCR });
  const listen = new URL(engine.base).host;
  const { context } = await launch();
  // The page talks to the engine through a proxy that drops the answer of every second write after the engine made it.
  const proxy = await lossyProxy(engine.base);
  try {
    const page = await openPage(context, proxy.base);
    const sent = uploads(page);
    await engine.stop({ keepData: true });
    await page.setInputFiles("#capture-pick", [png("a.png", 401), png("b.png", 402), png("c.png", 403)]);
    await until(async () => (await page.locator("#capture-preview img").count()) === 3, "three previews");
    await page.fill("#capture-text", "ohne Engine");
    await page.click("#capture-save");
    const waiting = page.locator('#feed [data-outbox="pending"]');
    await waiting.waitFor();
    assert.equal(await waiting.count(), 1, "one capture");
    assert.equal(await waiting.getAttribute("data-photos"), "3");
    assert.match(await waiting.textContent(), /3 photos/);
    await page.screenshot({ path: path.join(outDir, "photos-waiting.png") });
    assert.deepEqual(await idbCounts(page, ["entries", "blobs"]), { entries: 1, blobs: 6 });

    engine = await startEngine({ config: NO_OCR, listen, dir: engine.dir });
    await until(async () => (await page.locator("#feed [data-moment-id]").count()) === 1 && (await page.locator("#feed [data-outbox]").count()) === 0, "sent once the engine is back", 120_000);
    await until(async () => countKinds(await opKinds(engine.base))["media.put"] === 6, "every photo", 60_000);
    const counts = countKinds(await opKinds(engine.base));
    assert.equal(counts["moment.create"], 1, "one moment");
    assert.equal(counts["media.put"], 6, "each copy and original once");
    assert.equal(counts["turn.start"], 1, "one reading");
    const [moment] = (await api(engine.base, "/api/moments")).moments;
    assert.equal(moment.text, "ohne Engine");
    assert.deepEqual(shape(moment), ["copy0", "copy1", "copy2", "original0", "original1", "original2"]);
    assert.ok(proxy.stats.dropped > 0, "answers were dropped");
    // A dropped answer was repeated with the same media id: the engine said 200, never 409.
    assert.ok(sent.every((u) => u.status === 200 || u.status === 201), JSON.stringify(sent));
    assert.equal(new Set(sent.map((u) => u.id)).size, 6);
    await until(async () => (await idbCounts(page, ["entries", "blobs"])).blobs === 0, "the bytes leave the device once sent");
  } finally {
    await context.close();
    await proxy.close();
    await engine.stop();
  }
});

test("an undo of a Save of three photos takes them all out of the outbox and gives them back; the engine has nothing", { skip, timeout: 120_000 }, async () => {
  const engine = await startEngine({ config: NO_OCR });
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    const writes = [];
    page.on("request", (r) => {
      if (r.method() !== "GET" && r.url().includes("/api/") && !r.url().endsWith("/api/session")) writes.push(`${r.method()} ${new URL(r.url()).pathname}`);
    });
    await context.setOffline(true);
    await page.setInputFiles("#capture-pick", [png("x.png", 501), png("y.png", 502), png("z.png", 503)]);
    await until(async () => (await page.locator("#capture-preview img").count()) === 3, "three previews");
    await page.fill("#capture-text", "doch nicht");
    await page.click("#capture-save");
    await until(async () => (await page.locator('#feed [data-outbox="pending"]').count()) === 1, "one waiting capture");
    assert.deepEqual(await idbCounts(page, ["entries", "blobs"]), { entries: 1, blobs: 6 });
    assert.match(await page.textContent("#undo-text"), /Saved a capture of 3 photos on this device; not sent yet/);
    await page.click("#undo-save");
    await until(async () => /Undone: the capture of 3 photos was removed/.test(await page.textContent("#undo-text")), "the undo said");
    assert.deepEqual(await idbCounts(page, ["entries", "blobs"]), { entries: 0, blobs: 0 }, "nothing left in the outbox");
    assert.deepEqual(await page.locator("#capture-preview img").evaluateAll((imgs) => imgs.map((i) => i.alt)), ["photo 1 of 3: x.png", "photo 2 of 3: y.png", "photo 3 of 3: z.png"], "the photos are back, in order");
    assert.equal(await page.inputValue("#capture-text"), "doch nicht");
    await context.setOffline(false);
    await until(async () => (await page.textContent("#status")).startsWith("Online"), "online again");
    await new Promise((r) => setTimeout(r, 1500));
    assert.deepEqual(writes, [], "nothing was sent");
    assert.equal((await api(engine.base, "/api/moments")).moments.length, 0);
    const counts = countKinds(await opKinds(engine.base));
    assert.equal(counts["moment.create"] ?? 0, 0);
    assert.equal(counts["media.put"] ?? 0, 0, "no photo reached the engine");
  } finally {
    await context.close();
    await engine.stop();
  }
});

test("an original refused as too large parks the capture saying which photo; the other photos are on the engine", { skip, timeout: 120_000 }, async () => {
  // Every copy (at most 1024 px JPEG) fits in 2 MB; photo 2's noise original (9 MB) does not.
  const engine = await startEngine({ config: `[limits]\nmedia_limit_bytes = 2000000\n\n${NO_OCR}` });
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    await page.setInputFiles("#capture-pick", [png("klein.png", 601), { name: "riesig.png", mimeType: "image/png", buffer: noisePng(2048, 1536) }]);
    await until(async () => (await page.locator("#capture-preview img").count()) === 2, "two previews");
    await page.fill("#capture-text", "zu groß");
    await page.click("#capture-save");
    const parked = page.locator('#feed [data-outbox="parked"] [data-detail]');
    await parked.waitFor({ timeout: 60_000 });
    assert.match(await parked.textContent(), /The moment is saved, but the engine refused the original of photo 2: .*\(HTTP 413/);
    const [moment] = (await api(engine.base, "/api/moments")).moments;
    assert.deepEqual(shape(moment), ["copy0", "copy1", "original0"], "both copies and the first photo's original are there");
  } finally {
    await context.close();
    await engine.stop();
  }
});
