// The feed a page at a time: the first load reads one page of the newest
// moments (`order=newest&limit=`) and the turns of those moments only;
// "Show older moments" (a button, reached with the keyboard) and scrolling
// to the end read the next pages; the live feed still puts a new moment at
// the top, and one older than the pages read waits for its page.
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { api, browserOrSkip, countKinds, launch, opKinds, openPage, outDir, seedMoments, startEngine, ulidAt, until } from "./harness.mjs";

const skip = browserOrSkip();
const PAGE = 30;

/** The ids of the feed's moment rows, top to bottom. */
async function feedIds(page) {
  return page.evaluate(() => [...document.querySelectorAll("#feed [data-moment-id]")].map((r) => r.dataset.momentId));
}

test("the feed loads a page at a time, newest first, with the turns of what it shows only", { skip, timeout: 180_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const ids = await seedMoments(engine.base, 75);
    await until(async () => countKinds(await opKinds(engine.base))["turn.finish"] === 75, "every seeded reading done");
    const newestFirst = [...ids].reverse();
    const page = await context.newPage();
    const gets = [];
    page.on("request", (r) => {
      const url = new URL(r.url());
      if (r.method() === "GET" && url.pathname.startsWith("/api/")) gets.push(url.pathname + url.search);
    });
    await page.goto(engine.base);
    await page.waitForSelector("body[data-ready=true]", { timeout: 30_000 });
    await until(async () => (await page.locator('#feed [data-reading="done"]').count()) === PAGE, "the first page's readings");

    // One page of moments, and one turn read per moment shown.
    const lists = gets.filter((g) => g.startsWith("/api/moments?"));
    assert.deepEqual(lists, [`/api/moments?order=newest&limit=${PAGE}`], "one list request on load");
    const turnReads = gets.filter((g) => g.startsWith("/api/turns/"));
    assert.equal(turnReads.length, PAGE, `the turns of the ${PAGE} moments shown only (${turnReads.length})`);
    assert.deepEqual(await feedIds(page), newestFirst.slice(0, PAGE), "the newest first");
    assert.match(await page.textContent("#feed-count"), /30 moments shown, older ones below/);

    // A moment made now goes on top; one older than the pages read waits for its page.
    const fresh = (await (await fetch(`${engine.base}/api/moments`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ text: "ganz neu" }) })).json()).moment.id;
    const old = ulidAt(Date.now() - 3_600_000);
    await fetch(`${engine.base}/api/moments`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ id: old, text: "von früher" }) });
    await until(async () => (await feedIds(page))[0] === fresh, "the new moment on top");
    await new Promise((r) => setTimeout(r, 500));
    assert.ok(!(await feedIds(page)).includes(old), "a moment older than the pages read is not shown yet");
    assert.equal((await feedIds(page)).length, PAGE + 1);

    // "Show older moments" from the keyboard (focused without scrolling to
    // it, so that it is the key, not the end scrolled near, that loads).
    const more = page.locator("#feed-more");
    await page.evaluate(() => document.getElementById("feed-more").focus({ preventScroll: true }));
    await page.keyboard.press("Enter");
    await until(async () => (await feedIds(page)).length === 2 * PAGE + 1, "the second page");
    assert.deepEqual(gets.filter((g) => g.startsWith("/api/moments?")), [`/api/moments?order=newest&limit=${PAGE}`, `/api/moments?order=newest&limit=${PAGE}&after=${newestFirst[PAGE - 1]}`]);
    assert.equal(gets.filter((g) => g.startsWith("/api/turns/")).length, 2 * PAGE, "the second page's turns (the new moment has none)");
    assert.equal(await page.evaluate(() => document.activeElement?.id), "feed-more", "the focus stays on the control");
    await page.screenshot({ path: path.join(outDir, "paging.png") });

    // Scrolling to the end reads the last page; then the control goes.
    await page.evaluate(() => window.scrollTo(0, document.body.scrollHeight));
    await until(async () => (await feedIds(page)).length === 77, "every moment", 30_000);
    assert.ok(await more.isHidden(), "no more control once everything is shown");
    assert.deepEqual(await feedIds(page), [fresh, ...newestFirst, old], "each moment once, in id order, newest first");
    const all = (await api(engine.base, "/api/moments?limit=1000")).moments.map((m) => m.id);
    assert.equal(all.length, 77);
  } finally {
    await context.close();
    await engine.stop();
  }
});
