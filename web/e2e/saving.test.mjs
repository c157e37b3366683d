// Save keeps the capture in the form until it is stored (a newcomer lost a
// capture by closing the tab within a second of Save: the form was
// cleared before the copies were made, hashed and written, with nothing
// shown and nothing to stop the close). Here storing is slowed down (the
// page's SHA-256 waits 3 s): right after Save the form still holds the
// text and the photos and says "Saving…", the outbox holds nothing yet,
// and closing the page asks first; a photo chosen meanwhile waits for the
// next Save; once stored, the form is cleared, the capture shows in the
// feed, and the page closes without asking.
import { test } from "node:test";
import assert from "node:assert/strict";
import { browserOrSkip, idbCounts, launch, openPage, photoPng, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

const SLOW_DIGEST = `(() => {
  const subtle = globalThis.crypto?.subtle;
  if (!subtle) return;
  const real = subtle.digest.bind(subtle);
  subtle.digest = async (...args) => {
    if (globalThis.__sparkSlowDigest) await new Promise((r) => setTimeout(r, 3000));
    return real(...args);
  };
})();`;

test("Save shows Saving… and keeps the photos and text until stored; closing meanwhile asks to stay", { skip, timeout: 90_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    await context.addInitScript(SLOW_DIGEST);
    const page = await openPage(context, engine.base);
    await page.setInputFiles("#capture-pick", [
      { name: "a.png", mimeType: "image/png", buffer: photoPng(640, 480, 31) },
      { name: "b.png", mimeType: "image/png", buffer: photoPng(640, 480, 32) },
    ]);
    await until(async () => (await page.locator("#capture-preview img").count()) === 2, "two previews");
    await page.fill("#capture-text", "Einfahrt frei");
    await page.evaluate(() => (globalThis.__sparkSlowDigest = true));
    await page.click("#capture-save");
    // Not stored yet: the form holds it all, visibly saving.
    const form = await page.evaluate(() => ({
      text: document.querySelector("#capture-text").value,
      photos: document.querySelector("#capture-form").dataset.photos,
      saving: document.querySelector("#capture-saving").hidden ? "" : document.querySelector("#capture-saving").textContent,
      save: document.querySelector("#capture-save").disabled,
    }));
    assert.equal(form.text, "Einfahrt frei", "the text stays while it is stored");
    assert.equal(form.photos, "2", "the photos stay while they are stored");
    assert.match(form.saving, /Saving… .*stored on this device/);
    assert.equal(form.save, true, "Save is disabled meanwhile");
    assert.equal((await idbCounts(page, ["entries"])).entries, 0, "nothing in the outbox yet");

    // Closing the page now asks to stay.
    const dialog = page.waitForEvent("dialog", { timeout: 5000 });
    await page.close({ runBeforeUnload: true });
    const asked = await dialog;
    assert.equal(asked.type(), "beforeunload");
    await asked.dismiss();
    assert.equal(page.isClosed(), false, "the page stays");

    // A photo chosen meanwhile joins the form for the next Save, not this one.
    await page.setInputFiles("#capture-pick", [{ name: "c.png", mimeType: "image/png", buffer: photoPng(640, 480, 33) }]);

    // Stored: the form is cleared but for the photo chosen meanwhile, the
    // undo offered, and the page closes without asking.
    await until(async () => ((await idbCounts(page, ["entries"])).entries) === 1, "the capture stored", 20_000);
    await until(async () => (await page.inputValue("#capture-text")) === "" && (await page.getAttribute("#capture-form", "data-photos")) === "1", "the form cleared");
    assert.match(await page.getAttribute("#capture-preview img", "alt"), /c\.png/, "the photo chosen while saving stays for the next Save");
    await until(async () => {
      const moments = (await (await fetch(`${engine.base}/api/moments`)).json()).moments;
      return moments.length === 1 && moments[0].media.length === 4;
    }, "the capture sent with its two photos only", 30_000);
    assert.equal(await page.isHidden("#capture-saving"), true);
    await until(async () => (await page.locator("#feed [data-entry-id], #feed [data-moment-id]").count()) === 1, "the capture in the feed");
    let askedAgain = false;
    page.on("dialog", (d) => {
      askedAgain = true;
      void d.accept();
    });
    const closed = page.waitForEvent("close", { timeout: 5000 });
    await page.close({ runBeforeUnload: true });
    await closed;
    assert.equal(askedAgain, false, "no question once stored");
  } finally {
    await context.close();
    await engine.stop();
  }
});
