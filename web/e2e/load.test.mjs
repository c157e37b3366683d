// The page and a flaky engine: a load that fails is tried again with
// backoff while the outbox shows, and the status says whether the engine
// answers ("Online", "Reconnecting…", "Offline") instead of trusting the
// browser's network flag.
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { api, browserOrSkip, capture, launch, openPage, outDir, photoPng, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

test("a load whose requests fail shows the outbox, says it tries again, and loads once the engine answers", { skip, timeout: 120_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    // Every API request fails from here on (the page itself still loads).
    let down = true;
    await page.route("**/api/**", (route) => (down ? route.abort("connectionfailed") : route.continue()));
    await capture(page, photoPng(640, 480, 61), "beim Laden");
    await page.waitForSelector('#feed [data-outbox="pending"]');
    await page.reload();
    // The capture waiting on this device shows though nothing answered.
    await page.waitForSelector('#feed [data-outbox="pending"]', { timeout: 10_000 });
    const status = await until(async () => {
      const text = await page.textContent("#status");
      return /trying again/.test(text) ? text : null;
    }, "the status saying the load is tried again", 10_000);
    assert.match(status, /Can't reach the engine/);
    assert.equal(await page.getAttribute("body", "data-ready"), null, "not loaded yet");
    await page.screenshot({ path: path.join(outDir, "load-retrying.png") });
    down = false;
    await page.waitForSelector("body[data-ready=true]", { timeout: 30_000 });
    await until(async () => (await page.locator("#feed [data-outbox]").count()) === 0 && (await page.locator("#feed [data-moment-id]").count()) === 1, "the capture sent and shown", 30_000);
    const { moments } = await api(engine.base, "/api/moments");
    assert.deepEqual(moments.map((m) => m.text), ["beim Laden"]);
    assert.doesNotMatch(await page.textContent("#status"), /trying again/);
  } finally {
    await context.close();
    await engine.stop();
  }
});

test("the status says Online, then Reconnecting… while the engine is down, and Offline without a network", { skip, timeout: 60_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    await until(async () => (await page.textContent("#status")).startsWith("Online"), "Online");
    await engine.stop();
    const down = await until(async () => {
      const text = await page.textContent("#status");
      return text.startsWith("Reconnecting…") ? text : null;
    }, "Reconnecting… once the engine is gone", 20_000);
    assert.doesNotMatch(down, /online/i);
    await context.setOffline(true);
    await until(async () => (await page.textContent("#status")).startsWith("Offline"), "Offline without a network", 10_000);
    await context.setOffline(false);
    await until(async () => (await page.textContent("#status")).startsWith("Reconnecting…"), "Reconnecting… again with a network and no engine", 20_000);
  } finally {
    await context.close();
    await engine.stop();
  }
});
