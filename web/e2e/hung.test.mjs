// A hung engine (SIGSTOP: the connection is accepted, nothing answers)
// must not leave the page "Online" and "Sending the moment (1 of 4)…"
// forever: each request times out (20 s by default), the status says
// "Reconnecting…", and once the engine runs again the capture is sent,
// once.
import { test } from "node:test";
import assert from "node:assert/strict";
import { api, browserOrSkip, capture, countKinds, launch, openPage, opKinds, photoPng, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

test("a hung engine shows Reconnecting… after the request timeout, and the capture is sent once it runs again", { skip, timeout: 120_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  let stopped = false;
  try {
    const page = await openPage(context, engine.base);
    await until(async () => (await page.textContent("#status")).startsWith("Online"), "Online");
    process.kill(engine.child.pid, "SIGSTOP");
    stopped = true;
    await capture(page, photoPng(320, 240, 61), "haengt");
    await page.waitForSelector('#feed [data-outbox="sending"]');
    await until(async () => (await page.textContent("#status")).startsWith("Reconnecting…"), "Reconnecting…", 45_000);
    process.kill(engine.child.pid, "SIGCONT");
    stopped = false;
    await until(async () => (await api(engine.base, "/api/moments?limit=10")).moments.some((m) => m.text === "haengt"), "the capture sent", 60_000);
    await until(async () => (await page.locator("#feed [data-outbox]").count()) === 0, "the outbox empty", 60_000);
    await until(async () => (await page.textContent("#status")).startsWith("Online"), "Online again");
    const counts = countKinds(await opKinds(engine.base));
    assert.equal(counts["moment.create"], 1, "the moment made once");
  } finally {
    if (stopped) process.kill(engine.child.pid, "SIGCONT");
    await context.close();
    await engine.stop();
  }
});
