// Keyboard and contrast: every moment in the feed is reached with Tab and
// opened with Enter; the badges keep a 4.5:1 contrast in light and dark.
import { test } from "node:test";
import assert from "node:assert/strict";
import { browserOrSkip, capture, contrast, launch, openPage, photoPng, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

test("feed rows are reached with Tab and opened with Enter", { skip, timeout: 60_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const made = await fetch(`${engine.base}/api/moments`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ text: "Mit der Tastatur" }) });
    const id = (await made.json()).moment.id;
    const page = await openPage(context, engine.base);
    let reached = null;
    for (let i = 0; i < 40 && !reached; i++) {
      await page.keyboard.press("Tab");
      reached = await page.evaluate(() => document.activeElement?.dataset?.momentId ?? null);
    }
    assert.equal(reached, id, "Tab reaches the moment");
    await page.keyboard.press("Enter");
    await page.waitForSelector("#view-moment:not([hidden])");
    assert.equal(await page.textContent("#moment h2"), "Mit der Tastatur");
  } finally {
    await context.close();
    await engine.stop();
  }
});

for (const scheme of ["light", "dark"]) {
  test(`the pending badge has at least 4.5:1 contrast (${scheme})`, { skip, timeout: 60_000 }, async () => {
    const engine = await startEngine();
    const { context } = await launch();
    try {
      const page = await openPage(context, engine.base);
      await page.emulateMedia({ colorScheme: scheme });
      await context.setOffline(true);
      await capture(page, photoPng(320, 240, 91), "wartet");
      const badge = page.locator("#feed [data-outbox] .badge.pending");
      await badge.waitFor();
      // The row is re-rendered as the outbox changes: read a badge in the page.
      const { color, background } = await until(async () => {
        const c = await badge.first().evaluate((b) => (b.isConnected ? { color: getComputedStyle(b).color, background: getComputedStyle(b).backgroundColor } : null)).catch(() => null);
        return c && c.color && c.background ? c : null;
      }, "the badge's colours");
      const ratio = contrast(color, background);
      assert.ok(ratio >= 4.5, `${color} on ${background}: ${ratio.toFixed(2)}:1`);
    } finally {
      await context.close();
      await engine.stop();
    }
  });
}
