// Forgetting on the device (SPEC section 13): a sent capture keeps no text
// in the outbox, and once its moment is deleted (from this page or
// elsewhere) nothing of it stays in the outbox's IndexedDB (a newcomer
// found every sent capture's text kept there forever, deleted ones too).
import { test } from "node:test";
import assert from "node:assert/strict";
import { api, browserOrSkip, idbRecords, launch, openMoment, openPage, photoPng, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

async function capture(page, text, seed) {
  await page.setInputFiles("#capture-file", { name: `${seed}.png`, mimeType: "image/png", buffer: photoPng(320, 240, seed) });
  await page.waitForSelector("#capture-preview img");
  await page.fill("#capture-text", text);
  await page.click("#capture-save");
}

test("a sent capture keeps no text on the device, and a deleted moment leaves the outbox", { skip, timeout: 90_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    page.on("dialog", (d) => void d.accept());
    await capture(page, "WINDOWHERE", 81);
    await capture(page, "WINDOWTHERE", 82);
    await until(async () => {
      const all = await idbRecords(page, "entries");
      return all.length === 2 && all.every((e) => e.state === "done");
    }, "both captures sent");
    const sent = await idbRecords(page, "entries");
    assert.ok(!JSON.stringify(sent).includes("WINDOW"), `no text kept once sent: ${JSON.stringify(sent)}`);
    const byText = new Map((await api(engine.base, "/api/moments?limit=10")).moments.map((m) => [m.text, m.id]));
    const here = byText.get("WINDOWHERE");
    const there = byText.get("WINDOWTHERE");
    assert.ok(here && there, "both moments in the engine");

    // Deleted from this page.
    await openMoment(page, here);
    await page.click("#delete-moment");
    await until(async () => !(await idbRecords(page, "entries")).some((e) => e.moment_id === here), "the page's delete leaves the outbox");
    // Deleted elsewhere: the event stream tells the page.
    const gone = await fetch(`${engine.base}/api/moments/${there}`, { method: "DELETE" });
    assert.equal(gone.status, 200);
    await until(async () => (await idbRecords(page, "entries")).length === 0, "a delete made elsewhere leaves the outbox");
  } finally {
    await context.close();
    await engine.stop();
  }
});
