// A moment is a history entry (`#/moments/<id>`): Back (Android's too)
// returns to the feed with the keyboard on the row that was opened, not
// out of the app; Escape in a moment does the same; the moment's URL
// opens it directly.
import { test } from "node:test";
import assert from "node:assert/strict";
import { browserOrSkip, launch, openMoment, openPage, seedMoments, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

const focused = (page) => page.evaluate(() => document.activeElement?.dataset?.momentId ?? document.activeElement?.id ?? null);

test("Back and Escape from a moment return to the feed with focus on its row; its URL opens it", { skip, timeout: 90_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const [older, newer] = await seedMoments(engine.base, 2, { reading: false });
    const page = await openPage(context, engine.base);
    await openMoment(page, older);
    assert.equal(new URL(page.url()).hash, `#/moments/${older}`);
    await page.goBack();
    assert.equal(new URL(page.url()).origin, new URL(engine.base).origin, "still the app, not about:blank");
    await page.waitForSelector("#view-moments:not([hidden])");
    assert.equal(new URL(page.url()).hash, "");
    await until(async () => (await focused(page)) === older, "focus on the row opened");

    // From the keyboard: Enter opens, Escape returns.
    await page.locator(`#feed [data-moment-id="${newer}"]`).focus();
    await page.keyboard.press("Enter");
    await page.waitForSelector("#view-moment:not([hidden])");
    await page.keyboard.press("Escape");
    await page.waitForSelector("#view-moments:not([hidden])");
    await until(async () => (await focused(page)) === newer, "focus on the row after Escape");
    assert.equal(new URL(page.url()).hash, "");
    // "← Moments" too.
    await openMoment(page, older);
    await page.click("#back");
    await page.waitForSelector("#view-moments:not([hidden])");
    await until(async () => (await focused(page)) === older, "focus on the row after ← Moments");

    // The URL of a moment opens it.
    const direct = await context.newPage();
    await direct.goto(`${engine.base}/#/moments/${newer}`);
    await direct.waitForSelector("#view-moment:not([hidden])");
    await until(async () => (await direct.textContent("#moment h2")) === "Schild 1", "the moment of the URL");
  } finally {
    await context.close();
    await engine.stop();
  }
});
