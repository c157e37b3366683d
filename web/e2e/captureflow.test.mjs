// Capture as a person does it: the photo, its preview, the text, then
// Save. Nothing is stored or sent before Save, the text goes with the
// photo it was typed for, a bad file is refused with a reason and keeps
// what was typed, and several photos chosen at once are saved as one
// moment (issue 27; e2e/photos.test.mjs has the rest).
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { api, browserOrSkip, idbCounts, launch, openPage, outDir, photoPng, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

async function texts(base) {
  return (await api(base, "/api/moments?limit=1000")).moments.map((m) => m.text);
}

test("capture: photo, preview, text, Save; nothing before Save; a bad file is refused and the text kept", { skip, timeout: 120_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    const writes = [];
    page.on("request", (r) => {
      if (r.method() !== "GET" && r.url().includes("/api/")) writes.push(`${r.method()} ${r.url()}`);
    });
    assert.equal(await page.getAttribute("#capture-file", "capture"), "environment", "camera first on phones");

    // The photo first, then the text: nothing stored or sent until Save.
    await page.setInputFiles("#capture-file", { name: "tor.png", mimeType: "image/png", buffer: photoPng(640, 480, 71) });
    await page.waitForSelector("#capture-preview img");
    await page.fill("#capture-text", "erst das Foto");
    await new Promise((r) => setTimeout(r, 1500));
    assert.deepEqual(writes, [], "nothing sent before Save");
    assert.equal(await page.locator("#feed [data-outbox]").count(), 0, "nothing in the outbox before Save");
    assert.equal((await idbCounts(page, ["entries"])).entries, 0, "no outbox entry before Save");
    await page.screenshot({ path: path.join(outDir, "capture-preview.png") });
    await page.click("#capture-save");
    await until(async () => (await page.locator("#feed [data-moment-id]").count()) === 1, "the moment");
    assert.deepEqual(await texts(engine.base), ["erst das Foto"], "the text typed after the photo goes with it");
    assert.equal(await page.inputValue("#capture-text"), "");

    // A damaged photo and a file that is no photo: refused with a reason, the text kept, nothing stored.
    await until(async () => writes.length === 4, "the first capture's four requests");
    const before = writes.length;
    await page.fill("#capture-text", "bleibt stehen");
    await page.setInputFiles("#capture-file", { name: "kaputt.png", mimeType: "image/png", buffer: photoPng(640, 480, 72).subarray(0, 300) });
    await until(async () => (await page.textContent("#capture-error")).includes("kaputt.png"), "the damaged photo refused");
    assert.equal(await page.inputValue("#capture-text"), "bleibt stehen");
    await page.setInputFiles("#capture-pick", { name: "notiz.txt", mimeType: "text/plain", buffer: Buffer.from("hallo") });
    await until(async () => (await page.textContent("#capture-error")).includes("notiz.txt"), "the text file refused");
    assert.match(await page.textContent("#capture-error"), /not a photo/);
    assert.equal(await page.inputValue("#capture-text"), "bleibt stehen", "what was typed is kept");
    assert.equal(await page.locator("#capture-preview img").count(), 0);
    // Save with no photo says so, and keeps the text.
    await page.click("#capture-save");
    await until(async () => (await page.textContent("#capture-error")).includes("photo first"), "Save asks for a photo");
    assert.equal(await page.inputValue("#capture-text"), "bleibt stehen");
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(writes.length, before, "nothing sent for the bad files");
    assert.equal((await texts(engine.base)).length, 1);

    // Several photos at once: one moment with both, and the text typed for them.
    await page.setInputFiles("#capture-pick", [
      { name: "eins.png", mimeType: "image/png", buffer: photoPng(640, 480, 73) },
      { name: "zwei.png", mimeType: "image/png", buffer: photoPng(640, 480, 74) },
    ]);
    await until(async () => (await page.locator("#capture-preview img").count()) === 2, "two previews");
    await page.click("#capture-save");
    await until(async () => (await page.locator("#feed [data-moment-id]").count()) === 2, "the second moment", 60_000);
    assert.deepEqual((await texts(engine.base)).sort(), ["bleibt stehen", "erst das Foto"]);
    const both = (await api(engine.base, "/api/moments?limit=1000")).moments.find((m) => m.text === "bleibt stehen");
    await until(async () => (await api(engine.base, `/api/moments/${both.id}`)).media.length === 4, "both photos' copies and originals", 60_000);
    assert.deepEqual((await api(engine.base, `/api/moments/${both.id}`)).media.map((m) => m.photo).sort(), [0, 0, 1, 1]);
  } finally {
    await context.close();
    await engine.stop();
  }
});
