// A capture parked after its moment was made (its original refused as too
// large) shows the engine's reason with Retry and Remove, and the status
// says it needs the person rather than "waiting" for ever.
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { api, browserOrSkip, capture, launch, noisePng, openPage, outDir, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

test("an original refused as too large: the parked capture shows the reason, Retry asks again, Remove clears it", { skip, timeout: 120_000 }, async () => {
  // The copy (at most 1024 px JPEG) fits in 2 MB; the 2048 x 1536 noise original (9 MB) does not.
  const engine = await startEngine({ config: "[limits]\nmedia_limit_bytes = 2000000\n" });
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    page.on("dialog", (d) => void d.accept());
    const originals = [];
    page.on("response", (r) => {
      if (r.request().method() === "PUT" && r.request().headers()["x-media-role"] === "original") originals.push(r.status());
    });
    await capture(page, noisePng(2048, 1536), "zu groß");
    const parked = page.locator('#feed [data-outbox="parked"]');
    await parked.waitFor({ timeout: 60_000 });
    await until(async () => (await page.locator("#feed [data-moment-id]").count()) === 1, "the moment, made before the original was refused");
    const detail = await parked.locator("[data-detail]").textContent();
    assert.match(detail, /moment is saved/);
    assert.match(detail, /original photo/);
    assert.match(detail, /413/);
    const status = await page.textContent("#status");
    assert.match(status, /1 needs you/);
    assert.doesNotMatch(status, /waiting/);
    await page.screenshot({ path: path.join(outDir, "parked.png") });
    // Retry sends the original again (refused again, parked again).
    assert.deepEqual(originals, [413]);
    await parked.locator("button", { hasText: "Retry" }).click();
    await until(async () => originals.length === 2, "the retried upload");
    await parked.waitFor();
    // Remove drops it from this device; the moment stays.
    await parked.locator("button", { hasText: "Remove" }).click();
    await until(async () => (await page.locator("#feed [data-outbox]").count()) === 0, "the parked row removed");
    await until(async () => !/needs you|waiting/.test(await page.textContent("#status")), "the status clear");
    assert.equal((await api(engine.base, "/api/moments")).moments.length, 1, "the moment stays");
    await page.reload();
    await page.waitForSelector("body[data-ready=true]");
    assert.equal(await page.locator("#feed [data-outbox]").count(), 0, "gone from the outbox for good");
  } finally {
    await context.close();
    await engine.stop();
  }
});
