// ADR-036's two outcomes with the page's own clock moved (Date and
// Date.now in the page), against the real engine's clock window.
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { api, browserOrSkip, clockScript, launch, openPage, outDir, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();
const MIN = 60_000;

async function withMoment(engine) {
  const answer = await fetch(`${engine.base}/api/moments`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ text: "Zur Uhr" }) });
  return (await answer.json()).moment.id;
}

function messagePosts(page) {
  const seen = [];
  page.on("response", async (r) => {
    if (r.url().endsWith("/api/messages") && r.request().method() === "POST") {
      seen.push({ status: r.status(), id: JSON.parse(r.request().postData()).id });
    }
  });
  return seen;
}

test("the page 2 minutes behind: a message is accepted at once", { skip, timeout: 60_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const moment = await withMoment(engine);
    await context.addInitScript(clockScript(-2 * MIN));
    const page = await openPage(context, engine.base);
    const posts = messagePosts(page);
    await page.locator(`#feed [data-moment-id="${moment}"]`).click();
    await page.fill("#message-body", "zwei Minuten");
    await page.click("#message-form button");
    await page.waitForSelector('#thread [data-state="sent"]');
    assert.deepEqual(posts.map((p) => p.status), [202]);
    assert.equal((await api(engine.base, `/api/messages?thread=${moment}`)).messages.length, 1);
  } finally {
    await context.close();
    await engine.stop();
  }
});

test("ADR-036's case: 2 minutes behind, pending 3.5 minutes: clock_skew, one retry with a fresh id, accepted", { skip, timeout: 60_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const moment = await withMoment(engine);
    // The message is written while the page's clock reads 5.5 minutes
    // behind the engine's and the link is down; then 3.5 minutes pass on
    // the page (its clock is 2 minutes behind the engine's from then on):
    // by the page's clock the id is 3.5 minutes old, under the 4-minute
    // margin, so it is reused; the engine sees 5.5 minutes.
    await context.addInitScript(clockScript(-5.5 * MIN));
    const page = await openPage(context, engine.base);
    const posts = messagePosts(page);
    await page.locator(`#feed [data-moment-id="${moment}"]`).click();
    await context.setOffline(true);
    await page.fill("#message-body", "dreieinhalb Minuten");
    await page.click("#message-form button");
    await page.waitForSelector('#thread [data-state="pending"]');
    const pendingId = await page.locator("#thread [data-message-id]").getAttribute("data-message-id");
    await page.evaluate((offset) => (globalThis.__sparkClockOffsetMs = offset), -2 * MIN);
    await context.setOffline(false);
    await page.waitForSelector('#thread [data-state="sent"]', { timeout: 30_000 });
    await until(async () => posts.length === 2, "two posts");
    assert.deepEqual(posts.map((p) => p.status), [400, 202], "clock_skew on the reused id, then accepted");
    assert.equal(posts[0].id, pendingId, "the first try reused the pending id");
    assert.notEqual(posts[1].id, pendingId, "the retry has a fresh id");
    const stored = (await api(engine.base, `/api/messages?thread=${moment}`)).messages;
    assert.deepEqual(stored.map((m) => [m.id, m.body]), [[posts[1].id, "dreieinhalb Minuten"]]);
    assert.equal(await page.locator("#thread [data-message-id]").count(), 1, "one row, in its place");
  } finally {
    await context.close();
    await engine.stop();
  }
});

test("the page 6 minutes behind: the message fails with a clock text, no second round; retry is offered", { skip, timeout: 60_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const moment = await withMoment(engine);
    await context.addInitScript(clockScript(-6 * MIN));
    const page = await openPage(context, engine.base);
    const posts = messagePosts(page);
    await page.locator(`#feed [data-moment-id="${moment}"]`).click();
    await page.fill("#message-body", "sechs Minuten");
    await page.click("#message-form button");
    const row = page.locator('#thread [data-state="failed"]');
    await row.waitFor();
    assert.match(await row.textContent(), /clock is off by about 6\.0 minutes/);
    assert.equal(await row.locator("button").textContent(), "Retry");
    // From the top: a full-page capture of a scrolled page draws the
    // sticky header at its scrolled place, over the content.
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: path.join(outDir, "clock-failed.png"), fullPage: true });
    await new Promise((r) => setTimeout(r, 1000));
    assert.deepEqual(posts.map((p) => p.status), [400], "one request: no second round on a fresh id");
    assert.equal((await api(engine.base, `/api/messages?thread=${moment}`)).messages.length, 0);
    // The person sets the clock and retries: sent, in the same row.
    await page.evaluate(() => (globalThis.__sparkClockOffsetMs = 0));
    await row.locator("button").click();
    await page.waitForSelector('#thread [data-state="sent"]');
    assert.equal((await api(engine.base, `/api/messages?thread=${moment}`)).messages.length, 1);
  } finally {
    await context.close();
    await engine.stop();
  }
});
