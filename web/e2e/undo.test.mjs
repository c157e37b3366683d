// Undo of the last Save while the engine has none of it: the queued
// moment and its photos leave the outbox and the photos and text come
// back into the form; never after the moment's create was acknowledged
// (mid-send, the undo waits for the answer); after a create that had no
// answer, the engine is asked first.
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { api, browserOrSkip, capture, idbCounts, idbRecords, launch, openPage, outDir, photoPng, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

function writes(page) {
  const seen = [];
  page.on("request", (r) => {
    if (r.method() !== "GET" && r.url().includes("/api/") && !r.url().endsWith("/api/session")) seen.push(`${r.method()} ${new URL(r.url()).pathname}`);
  });
  return seen;
}

test("offline: Undo takes the last Save (two photos) out of the outbox with its media and gives the photos and text back", { skip, timeout: 120_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    const sent = writes(page);
    await context.setOffline(true);
    await page.setInputFiles("#capture-pick", [
      { name: "eins.png", mimeType: "image/png", buffer: photoPng(320, 240, 101) },
      { name: "zwei.png", mimeType: "image/png", buffer: photoPng(320, 240, 102) },
    ]);
    await until(async () => (await page.locator("#capture-preview img").count()) === 2, "two previews");
    assert.match(await page.textContent("#capture-several"), /saved as one moment/, "says the photos make one moment");
    await page.fill("#capture-text", "doch nicht");
    await page.click("#capture-save");
    await until(async () => (await page.locator('#feed [data-outbox="pending"]').count()) === 1, "one waiting row");
    assert.deepEqual(await idbCounts(page, ["entries", "blobs"]), { entries: 1, blobs: 4 });
    const bar = page.locator("#undo");
    await bar.waitFor();
    assert.match(await page.textContent("#undo-text"), /Saved a capture of 2 photos on this device; not sent yet/);
    await page.screenshot({ path: path.join(outDir, "undo.png") });
    await page.click("#undo-save");
    await until(async () => /Undone: the capture of 2 photos was removed/.test(await page.textContent("#undo-text")), "the undo said");
    assert.deepEqual(await idbCounts(page, ["entries", "blobs"]), { entries: 0, blobs: 0 }, "nothing left in the outbox");
    assert.equal(await page.locator("#feed [data-outbox]").count(), 0);
    assert.equal(await page.locator("#capture-preview img").count(), 2, "the photos are back in the form");
    assert.equal(await page.inputValue("#capture-text"), "doch nicht", "and the text");
    assert.ok(await page.locator("#undo-save").isHidden(), "nothing more to undo");
    await context.setOffline(false);
    await until(async () => (await page.textContent("#status")).startsWith("Online"), "online again");
    await new Promise((r) => setTimeout(r, 1500));
    assert.deepEqual(sent, [], "nothing was sent");
    assert.equal((await api(engine.base, "/api/moments")).moments.length, 0);
    // Saved again from the form: sent, and no undo once the engine has it.
    await page.click("#capture-save");
    await until(async () => (await page.locator("#feed [data-moment-id]").count()) === 1, "sent, as one moment");
    await until(async () => await page.locator("#undo-save").isHidden(), "no undo after the engine has them");
  } finally {
    await context.close();
    await engine.stop();
  }
});

test("mid-send: an undo during the create's request waits for its answer and leaves the acknowledged moment", { skip, timeout: 120_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    let release;
    const held = new Promise((r) => (release = r));
    await page.route("**/api/moments", async (route) => {
      if (route.request().method() !== "POST") return route.continue();
      await held;
      return route.continue();
    });
    await capture(page, photoPng(320, 240, 103), "unterwegs");
    await page.waitForSelector('#feed [data-outbox="sending"]');
    assert.match(await page.textContent('#feed [data-outbox="sending"] [data-detail]'), /Sending the moment/);
    assert.match(await page.textContent("#undo-text"), /sending now/);
    await page.click("#undo-save");
    assert.equal(await page.textContent("#undo-text"), "Undoing…");
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(await page.textContent("#undo-text"), "Undoing…", "waits for the answer in flight");
    release();
    await until(async () => /Too late for one: the engine already has it/.test(await page.textContent("#undo-text")), "too late, said");
    await until(async () => (await page.locator("#feed [data-moment-id]").count()) === 1, "the moment stays");
    assert.equal(await page.locator("#capture-preview img").count(), 0, "nothing given back");
    await until(async () => (await idbCounts(page, ["entries", "blobs"])).entries === 1 && (await page.locator("#feed [data-outbox]").count()) === 0, "the rest sent");
    await until(async () => (await api(engine.base, "/api/moments")).moments[0]?.media.length === 2, "the copy and the original");
  } finally {
    await context.close();
    await engine.stop();
  }
});

test("a create that went out with no answer: the undo asks the engine and undoes one that never arrived; one that arrived shows and is not offered", { skip, timeout: 120_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    const asked = [];
    page.on("request", (r) => {
      if (r.method() === "GET" && /\/api\/moments\/\w+$/.test(r.url())) asked.push(new URL(r.url()).pathname);
    });
    // "abort": every create fails before the engine; "lose": the first reaches it and its answer is lost.
    let mode = "abort";
    // `lost` counts creates the engine answered (and the page never saw).
    let lost = 0;
    await page.route("**/api/moments", async (route) => {
      if (route.request().method() !== "POST") return route.continue();
      if (mode === "lose") {
        mode = "abort";
        await route.fetch();
        lost += 1;
      }
      return route.abort("connectionreset");
    });
    const waiting = async () => /did not answer the last try/.test(await page.textContent('#feed [data-outbox="pending"] [data-detail]').catch(() => ""));

    await capture(page, photoPng(320, 240, 105), "nie angekommen");
    await until(waiting, "the create without an answer");
    const id = (await idbRecords(page, "entries"))[0].moment_id;
    await page.click("#undo-save");
    await until(async () => /Undone: the capture was removed/.test(await page.textContent("#undo-text")), "undone: the engine has none of it");
    assert.ok(asked.includes(`/api/moments/${id}`), "the engine was asked first");
    assert.equal(await page.inputValue("#capture-text"), "nie angekommen");
    assert.equal((await idbCounts(page, ["entries", "blobs"])).entries, 0);
    await page.click("#capture-clear");
    await page.fill("#capture-text", "");

    mode = "lose";
    await capture(page, photoPng(320, 240, 104), "angekommen");
    await until(async () => lost === 1, "the create whose answer is lost");
    assert.deepEqual((await api(engine.base, "/api/moments")).moments.map((m) => m.text), ["angekommen"], "the engine has it");
    // The event stream tells of it: it shows in the feed, its row says what is still to send, no undo is offered.
    const row = page.locator("#feed [data-moment-id]");
    await row.waitFor();
    await until(async () => /did not answer the last try/.test(await row.locator("[data-outbox-note]").textContent()), "the row's note");
    await until(async () => await page.locator("#undo-save").isHidden(), "no undo once the feed shows it");
    assert.equal((await idbCounts(page, ["entries", "blobs"])).entries, 1, "kept, to be sent");
    await page.unroute("**/api/moments");
    await until(async () => (await page.locator("#feed [data-moment-id]").count()) === 1 && (await page.locator("#feed [data-outbox]").count()) === 0, "sent once the link is back", 60_000);
    assert.deepEqual((await api(engine.base, "/api/moments")).moments.map((m) => m.text), ["angekommen"]);
  } finally {
    await context.close();
    await engine.stop();
  }
});
