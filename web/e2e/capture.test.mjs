// Capture through the page in headless Chromium against the real engine:
// the moment, its copy (at most 1024 px, JPEG), its reading and its
// original arrive, once; a change re-renders one row, not the list.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import path from "node:path";
import { api, browserOrSkip, capture, countKinds, jpegSize, launch, openPage, opKinds, outDir, photoPng, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

test("capture through the page: moment, copy, reading and original arrive once", { skip, timeout: 120_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    await page.screenshot({ path: path.join(outDir, "empty.png") });
    const photo = photoPng(2000, 1500, 3);
    await capture(page, photo, "Ausfahrt freihalten");
    const row = page.locator("#feed [data-moment-id]");
    await until(async () => (await row.count()) === 1 && (await row.getAttribute("data-reading")) === "done", "the reading in the feed");
    const momentId = await row.getAttribute("data-moment-id");
    const moment = await api(engine.base, `/api/moments/${momentId}`);
    assert.equal(moment.text, "Ausfahrt freihalten");
    const copy = moment.media.find((m) => m.role === "copy");
    const original = moment.media.find((m) => m.role === "original");
    await until(async () => (await api(engine.base, `/api/moments/${momentId}`)).media.length === 2, "the original");
    const full = await api(engine.base, `/api/moments/${momentId}`);
    const originalMedia = full.media.find((m) => m.role === "original");
    assert.ok(copy, "a copy");
    assert.equal(copy.content_type, "image/jpeg");
    const copyBytes = Buffer.from(await (await fetch(`${engine.base}/api/media/${copy.id}`)).arrayBuffer());
    const size = jpegSize(copyBytes);
    assert.ok(size, "the copy is a JPEG");
    assert.deepEqual(size, { width: 1024, height: 768 }, "resized to at most 1024 px, aspect kept");
    assert.equal(originalMedia.sha256, createHash("sha256").update(photo).digest("hex"), "the original is the photo, byte for byte");
    assert.equal(originalMedia.content_type, "image/png");
    void original;
    const turn = await api(engine.base, `/api/turns/${moment.turns[0]}`);
    assert.equal(turn.status, "done");
    assert.ok(turn.answer.length > 0);
    // The page shows the reading.
    assert.equal(await row.locator(".snippet").textContent(), turn.answer);
    // Once: one moment, two media, one turn.
    const counts = countKinds(await opKinds(engine.base));
    assert.equal(counts["moment.create"], 1);
    assert.equal(counts["media.put"], 2);
    assert.equal(counts["turn.start"], 1);
    await page.screenshot({ path: path.join(outDir, "feed.png") });

    // A second capture, then an edit of the first: only its row is re-rendered.
    await capture(page, photoPng(800, 600, 4), "Bitte nicht stören");
    await until(async () => (await row.count()) === 2 && (await page.locator('#feed [data-reading="done"]').count()) === 2, "the second row and its reading");
    // Wait for the second capture's last step (its original) before marking the rows.
    await until(async () => countKinds(await opKinds(engine.base))["media.put"] === 4, "the second original");
    await new Promise((r) => setTimeout(r, 300));
    await page.evaluate(() => document.querySelectorAll("#feed [data-moment-id]").forEach((r) => (r.__kept = true)));
    const before = String((await api(engine.base, `/api/moments/${momentId}`)).version);
    const edit = await fetch(`${engine.base}/api/moments/${momentId}`, { method: "PATCH", headers: { "content-type": "application/json" }, body: JSON.stringify({ caption: "am Tor" }) });
    assert.equal(edit.status, 200);
    const kept = await until(async () => {
      const rows = await page.evaluate(() => [...document.querySelectorAll("#feed [data-moment-id]")].map((r) => [r.dataset.momentId, Boolean(r.__kept), r.dataset.version]));
      return rows.find(([id, , v]) => id === momentId && v !== before) ? rows : null;
    }, "the edited row");
    for (const [id, same] of kept) assert.equal(same, id !== momentId, `row ${id}: ${id === momentId ? "re-rendered" : "untouched"}`);

    // The moment view: copy, reading, keep a phrase, a message.
    await page.locator(`#feed [data-moment-id="${momentId}"]`).click();
    await page.waitForSelector("#moment-reading[data-status=done]");
    await page.fill("#keep-phrase", "Ausfahrt freihalten");
    await page.click("#keep-form button");
    await page.fill("#message-body", "Ich parke woanders");
    await page.click("#message-form button");
    await page.waitForSelector('#thread [data-state="sent"]');
    // From the top: a full-page capture of a scrolled page draws the
    // sticky header at its scrolled place, over the content.
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: path.join(outDir, "moment.png"), fullPage: true });
    const marks = await api(engine.base, "/api/phrases");
    assert.deepEqual(marks.marks.map((m) => m.phrase), ["ausfahrt freihalten"]);
    // Quick recall from the kept phrase.
    await page.click('nav [data-view="recall"]');
    await page.waitForSelector('#phrases [data-mark-id="keep:ausfahrt freihalten"]');
    await page.click("#recall-start");
    await page.waitForSelector("#recall-out[data-status=done]", { timeout: 60_000 });
    await page.screenshot({ path: path.join(outDir, "recall.png") });
    // The log view: head and chain, and the live tail; at the page's foot, not in the main navigation.
    assert.deepEqual(await page.locator("nav button").allTextContents(), ["Moments", "Recall"]);
    await page.click("#open-log");
    const head = await api(engine.base, "/api/log/head");
    await until(async () => (await page.textContent("#head-chain")) === (await api(engine.base, "/api/log/head")).chain, "the chain value");
    assert.ok(Number(await page.textContent("#head-seq")) >= head.seq);
    assert.ok((await page.locator("#tail li").count()) > 0, "the live tail shows ops");
    await page.screenshot({ path: path.join(outDir, "log.png") });
  } finally {
    await context.close();
    await engine.stop();
  }
});
