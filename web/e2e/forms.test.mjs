// The moment view's forms: keeping a phrase says so (not a browser
// validation bubble) and works again after a refusal; a message hit by a
// network error or a 5xx in the sending tab is sent again after the
// backoff's first steps, not after the idle pass.
import { test } from "node:test";
import assert from "node:assert/strict";
import { api, browserOrSkip, launch, openMoment, openPage, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

async function withMoment(engine, text) {
  const answer = await fetch(`${engine.base}/api/moments`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ text }) });
  return (await answer.json()).moment.id;
}

test("keep a phrase: success says Kept, a refusal says why, and the form keeps working", { skip, timeout: 60_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const moment = await withMoment(engine, "Guten Tag");
    const page = await openPage(context, engine.base);
    await openMoment(page, moment);
    await page.fill("#keep-phrase", "Guten Tag");
    await page.click("#keep-form button");
    await until(async () => (await page.textContent("#keep-status")).includes("Kept"), "Kept");
    assert.equal(await page.inputValue("#keep-phrase"), "");
    assert.equal(await page.$eval("#keep-phrase", (i) => i.validity.customError), false, "no validation message set");
    // Refused (over 200 characters): the reason, in the page.
    await page.fill("#keep-phrase", "x".repeat(201));
    await page.click("#keep-form button");
    await until(async () => (await page.textContent("#keep-status")).startsWith("Not kept"), "the refusal");
    // The form still submits.
    await page.fill("#keep-phrase", "Auf Wiedersehen");
    await page.click("#keep-form button");
    await until(async () => (await api(engine.base, "/api/phrases")).marks.some((m) => m.phrase === "auf wiedersehen"), "the second phrase kept", 10_000);
    await until(async () => (await page.textContent("#keep-status")).includes("Auf Wiedersehen"), "Kept, again");
    assert.deepEqual((await api(engine.base, "/api/phrases")).marks.map((m) => m.phrase).sort(), ["auf wiedersehen", "guten tag"]);
  } finally {
    await context.close();
    await engine.stop();
  }
});

test("a message hit by a network error or a 503 in the sending tab is sent after the backoff, not the idle pass", { skip, timeout: 60_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const moment = await withMoment(engine, "Rückruf");
    const page = await openPage(context, engine.base);
    await page.waitForSelector('#status[data-sender="true"]');
    await openMoment(page, moment);
    const trouble = [];
    await page.route("**/api/messages", (route) => {
      if (route.request().method() !== "POST" || !trouble.length) return route.continue();
      const kind = trouble.shift();
      if (kind === "network") return route.abort("connectionreset");
      return route.fulfill({ status: 503, contentType: "application/problem+json", body: JSON.stringify({ status: 503, code: "unavailable", detail: "try later" }) });
    });
    for (const [kind, body] of [["network", "nach dem Netzfehler"], ["503", "nach dem 503"]]) {
      trouble.push(kind);
      const start = Date.now();
      await page.fill("#message-body", body);
      await page.click("#message-form button");
      await until(async () => (await api(engine.base, `/api/messages?thread=${moment}`)).messages.some((m) => m.body === body), `the message after a ${kind} failure`, 10_000);
      const took = Date.now() - start;
      assert.ok(took < 8_000, `sent after ${took} ms (the backoff's first steps, not the 30 s idle pass)`);
    }
    await until(async () => (await page.locator('#thread [data-state="sent"]').count()) === 2, "both shown as sent");
  } finally {
    await context.close();
    await engine.stop();
  }
});
