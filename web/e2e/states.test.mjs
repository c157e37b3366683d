// Every outbox state, visible and actionable: waiting (with its copy and
// what it waits for: a network, the engine, the captures before it),
// sending (which step), the moment's row saying what of it is still being
// sent, and a failed message (a clock 6 minutes behind) in plain words at
// the top of the feed with Retry and a way to its thread.
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { api, browserOrSkip, capture, clockScript, launch, openPage, outDir, photoPng, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

const detail = (page, state) => page.locator(`#feed [data-outbox="${state}"] [data-detail]`);

test("waiting says what for, with the copy; sending says which step; a waiting capture can be removed", { skip, timeout: 120_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    page.on("dialog", (d) => void d.accept());
    // No network: the status and the row say so.
    await context.setOffline(true);
    await capture(page, photoPng(320, 240, 111), "ohne Netz");
    await capture(page, photoPng(320, 240, 112), "dahinter");
    await until(async () => (await page.locator('#feed [data-outbox="pending"]').count()) === 2, "two waiting rows");
    await until(async () => (await page.textContent("#status")).startsWith("Offline"), "Offline in the status");
    assert.match(await page.textContent("#status"), /2 waiting to send/);
    for (const text of await detail(page, "pending").allTextContents()) assert.match(text, /this device is offline/);
    const thumb = page.locator('#feed [data-outbox="pending"] img').first();
    assert.ok(await thumb.evaluate((img) => img.complete && img.naturalWidth > 0), "the waiting capture shows its copy");
    await page.screenshot({ path: path.join(outDir, "states-offline.png") });

    // The engine in trouble: the first waits on it (and says when it tries again), the second behind it.
    let trouble = true;
    await page.route("**/api/moments", (route) => (route.request().method() === "POST" && trouble
      ? route.fulfill({ status: 503, contentType: "application/problem+json", body: JSON.stringify({ status: 503, code: "unavailable", title: "unavailable", detail: "restarting" }) })
      : route.continue()));
    await context.setOffline(false);
    await until(async () => /the engine has trouble \(HTTP 503\)\. Next try at/.test((await detail(page, "pending").allTextContents()).join("|")), "the 503 said, with the next try");
    const texts = await detail(page, "pending").allTextContents();
    assert.ok(texts.some((t) => /1 capture before it/.test(t)), texts.join(" | "));

    // The second removed while waiting (the engine has none of it).
    const second = page.locator('#feed [data-outbox="pending"]', { hasText: "dahinter" });
    await second.getByRole("button", { name: "Remove “dahinter”" }).click();
    await until(async () => (await page.locator("#feed [data-outbox]").count()) === 1, "removed");

    // Sending: the create held in flight.
    let release;
    const held = new Promise((r) => (release = r));
    await page.unroute("**/api/moments");
    await page.route("**/api/moments", async (route) => {
      if (route.request().method() === "POST") await held;
      return route.continue();
    });
    trouble = false;
    await page.waitForSelector('#feed [data-outbox="sending"]', { timeout: 60_000 });
    assert.match(await detail(page, "sending").textContent(), /Sending the moment \(1 of 4\)/);
    assert.equal(await page.textContent('#feed [data-outbox="sending"] .badge'), "sending");
    // The original held too: the moment's row says it is still being sent.
    let releaseOriginal;
    const original = new Promise((r) => (releaseOriginal = r));
    await page.route("**/api/media/*", async (route) => {
      if (route.request().headers()["x-media-role"] === "original") await original;
      return route.continue();
    });
    release();
    const row = page.locator("#feed [data-moment-id]");
    await row.waitFor();
    await until(async () => /Sending the original photo/.test(await row.locator("[data-outbox-note]").textContent()), "the row says the original is being sent");
    releaseOriginal();
    await until(async () => (await row.locator("[data-outbox-note]").textContent()) === "", "nothing more to send");
    assert.deepEqual((await api(engine.base, "/api/moments")).moments.map((m) => m.text), ["ohne Netz"]);
  } finally {
    await context.close();
    await engine.stop();
  }
});

test("a message failed on a clock 6 minutes behind: at the top of the feed in plain words, with Retry and its thread", { skip, timeout: 60_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const made = await fetch(`${engine.base}/api/moments`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ text: "Zur Uhr" }) });
    const moment = (await made.json()).moment.id;
    await context.addInitScript(clockScript(-6 * 60_000));
    const page = await openPage(context, engine.base);
    await page.locator(`#feed [data-moment-id="${moment}"]`).click();
    await page.fill("#message-body", "zu spät");
    await page.click("#message-form button");
    await page.waitForSelector('#thread [data-state="failed"]');
    await page.click("#back");
    const row = page.locator('#feed [data-outbox="failed"]');
    await row.waitFor();
    const text = await row.locator("[data-detail]").textContent();
    assert.match(text, /clock is off by about 6\.0 minutes \(behind the engine's/);
    assert.match(text, /at most 5 minutes off/);
    assert.match(text, /Set this device's date and time/);
    assert.match(await page.textContent("#status"), /1 needs you/);
    await page.screenshot({ path: path.join(outDir, "states-failed-message.png") });
    // Its thread, from the row.
    await row.getByRole("button", { name: "Open its moment" }).click();
    await page.waitForSelector("#view-moment:not([hidden])");
    assert.equal(await page.textContent("#moment h2"), "Zur Uhr");
    await page.click("#back");
    // The clock set right, Retry sends it and the row goes.
    await page.evaluate(() => (globalThis.__sparkClockOffsetMs = 0));
    await row.getByRole("button", { name: "Retry the message “zu spät”" }).click();
    await until(async () => (await page.locator('#feed [data-outbox="failed"]').count()) === 0, "the row gone");
    await until(async () => (await api(engine.base, `/api/messages?thread=${moment}`)).messages.length === 1, "sent");
  } finally {
    await context.close();
    await engine.stop();
  }
});
