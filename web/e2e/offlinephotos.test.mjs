// Offline, a moment's photos after the first (of which no thumbnail is
// kept) show a plain "Photo N is not available offline" instead of a
// broken image, and Edit, Delete and Keep say at once that they need the
// engine.
import { test } from "node:test";
import assert from "node:assert/strict";
import { browserOrSkip, launch, openMoment, openPage, photoPng, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

test("offline, photos not kept show a placeholder, and Edit, Delete, Keep say they need the engine", { skip, timeout: 120_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    await page.setInputFiles("#capture-pick", [1, 2, 3].map((n) => ({ name: `${n}.png`, mimeType: "image/png", buffer: photoPng(400, 300, 40 + n) })));
    await until(async () => (await page.locator("#capture-preview img").count()) === 3, "three previews");
    await page.fill("#capture-text", "drei Fotos");
    await page.click("#capture-save");
    await until(async () => (await page.locator('#feed [data-moment-id][data-photos="3"]').count()) === 1 && (await page.locator("#feed [data-outbox]").count()) === 0, "the capture sent", 60_000);
    const id = await page.locator("#feed [data-moment-id]").first().getAttribute("data-moment-id");
    // Its feed thumbnail (photo 1) is kept on the device.
    await until(async () => (await page.locator(`#feed [data-moment-id="${id}"] img`).evaluate((i) => i.complete && i.naturalWidth > 0)), "the thumbnail loaded");
    await page.waitForTimeout(1500);

    await context.setOffline(true);
    await page.reload();
    await page.waitForSelector("#last-seen");
    page.on("dialog", (d) => void d.dismiss());
    await openMoment(page, id);
    await until(async () => (await page.locator("#moment [data-missing=true]").count()) === 2, "two placeholders");
    assert.deepEqual(await page.locator("#moment [data-missing=true]").allTextContents(), ["Photo 2 is not available offline", "Photo 3 is not available offline"]);
    assert.equal(await page.getByRole("img", { name: "Photo 3 is not available offline" }).count(), 1, "named for a screen reader");
    const broken = await page.$$eval("#moment img", (imgs) => imgs.filter((i) => i.complete && i.naturalWidth === 0).length);
    assert.equal(broken, 0, "no broken image");

    await page.click("#edit-open");
    assert.match(await page.textContent("#edit-status"), /Editing needs the engine/);
    assert.equal(await page.isVisible("#edit-form"), false);
    await page.click("#delete-moment");
    assert.match(await page.textContent("#edit-status"), /Deleting needs the engine/);
    await page.fill("#keep-phrase", "drei");
    await page.click("#keep-form button[type=submit]");
    assert.match(await page.textContent("#keep-status"), /Keeping a phrase needs the engine/);
  } finally {
    await context.close();
    await engine.stop();
  }
});
