// A capture made while the engine is away goes as soon as the engine
// answers again, not after the outbox's backoff has run out (which grows
// to half a minute and more: a newcomer saw "Online · 1 waiting to send"
// for 22 to 47 s after the engine came back).
import { test } from "node:test";
import assert from "node:assert/strict";
import { api, browserOrSkip, capture, launch, openPage, photoPng, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

test("a capture waiting out a long backoff is sent within seconds of the engine coming back", { skip, timeout: 150_000 }, async () => {
  let engine = await startEngine();
  const listen = new URL(engine.base).host;
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    let failed = 0;
    page.on("requestfailed", (r) => {
      if (r.method() === "POST" && new URL(r.url()).pathname === "/api/moments") failed += 1;
    });
    await engine.stop({ keepData: true });
    await capture(page, photoPng(320, 240, 91), "wartet");
    // Seven tries failed: the next one is 16 to 32 s away (the backoff
    // doubles from 0.5 s, each wait drawn from its upper half).
    await until(async () => failed >= 7, "seven failed tries", 90_000);
    engine = await startEngine({ listen, dir: engine.dir });
    const back = Date.now();
    await until(async () => (await api(engine.base, "/api/moments?limit=10")).moments.some((m) => m.text === "wartet"), "the capture sent", 30_000);
    const seconds = (Date.now() - back) / 1000;
    assert.ok(seconds < 12, `sent ${seconds.toFixed(1)} s after the engine came back (the backoff alone would wait 16 s or more)`);
    await until(async () => (await page.locator("#feed [data-outbox]").count()) === 0, "the outbox empty");
  } finally {
    await context.close();
    await engine.stop();
  }
});
