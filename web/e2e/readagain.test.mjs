// "Read again": a moment whose reading failed (or that has none) asks the
// engine for a new practical turn under a fresh request id (the failed
// turn's own would answer with that turn, SPEC section 3); a try whose
// answer was lost goes again under the same request id, so one turn is
// started; the control says where it stands.
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { NO_OCR, api, browserOrSkip, countKinds, launch, openMoment, openPage, opKinds, outDir, photoPng, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

/** The bodies of the page's POSTs to a moment's turns, as sent. */
function turnPosts(page) {
  const seen = [];
  page.on("request", (r) => {
    if (r.method() === "POST" && /\/api\/moments\/\w+\/turns$/.test(r.url())) seen.push(JSON.parse(r.postData()));
  });
  return seen;
}

test("a failed reading is read again under a fresh request id; passing trouble retries under the same one; a lost answer starts one turn", { skip, timeout: 120_000 }, async () => {
  const engine = await startEngine({ config: NO_OCR });
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    const posts = turnPosts(page);
    // No text, and OCR off: the offline brain has nothing to read, the turn fails.
    await page.setInputFiles("#capture-file", { name: "leer.png", mimeType: "image/png", buffer: photoPng(320, 240, 81) });
    await page.waitForSelector("#capture-preview img");
    await page.click("#capture-save");
    const row = page.locator("#feed [data-moment-id]");
    await until(async () => (await row.count()) === 1 && (await row.getAttribute("data-reading")) === "failed", "the failed reading");
    const id = await row.getAttribute("data-moment-id");
    const [first] = (await api(engine.base, `/api/moments/${id}`)).turns;
    const failed = await api(engine.base, `/api/turns/${first}`);
    assert.equal(failed.status, "failed");

    await openMoment(page, id);
    await page.waitForSelector("#moment-reading[data-status=failed]");
    const button = page.locator("#read-again");
    assert.equal(await button.textContent(), "Read again");
    assert.ok(await button.isVisible());
    await page.screenshot({ path: path.join(outDir, "read-again.png") });

    // The engine busy (a 503 that never reached it): said, and the retry goes under the same request id.
    let answer = "503";
    await page.route("**/api/moments/*/turns", async (route) => {
      const now = answer;
      answer = "pass";
      if (now === "503") return route.fulfill({ status: 503, contentType: "application/problem+json", body: JSON.stringify({ status: 503, code: "unavailable", title: "unavailable", detail: "busy" }) });
      if (now === "lose") {
        await route.fetch(); // the engine starts the turn ...
        return route.abort("connectionreset"); // ... and its answer is lost
      }
      return route.continue();
    });
    await button.click();
    await until(async () => /the engine has trouble \(HTTP 503\)/.test(await page.textContent("#read-again-status")), "the 503 said");
    assert.equal(await page.getAttribute("#read-again-row", "data-state"), "failed");
    await button.click();
    // Still nothing to read: the new turn fails too, and is offered again.
    await until(async () => (await api(engine.base, `/api/moments/${id}`)).turns.length === 2, "the second turn");
    await until(async () => (await page.getAttribute("#moment-reading", "data-status")) === "failed" && (await page.textContent("#read-again-status")) === "", "the second failure shown");
    await until(async () => await button.isVisible(), "offered again");

    // Give the brain something to read; this time the answer is lost.
    await page.click("#edit-open");
    await page.fill("#edit-text", "Notausgang");
    await page.click("#edit-form button[type=submit]");
    await until(async () => (await page.textContent("#edit-status")) === "Saved.", "the edit");
    answer = "lose";
    await button.click();
    // The event stream tells of the turn the lost answer started.
    await page.waitForSelector("#moment-reading[data-status=done]", { timeout: 30_000 });
    assert.match(await page.textContent("#moment-reading"), /Notausgang/);
    await until(async () => await button.isHidden(), "no longer offered once read");
    assert.doesNotMatch(await page.textContent("#read-again-status"), /did not answer/);

    // Request ids: the capture's; the 503's and its retry alike, fresh; a fresh one after.
    assert.equal(posts.length, 4, posts.map((p) => p.client_request_id).join(" "));
    assert.equal(posts[0].client_request_id, failed.request_id);
    assert.equal(posts[1].client_request_id, posts[2].client_request_id, "passing trouble: the same request id again");
    assert.notEqual(posts[1].client_request_id, failed.request_id, "a fresh request id, not the failed turn's");
    assert.notEqual(posts[3].client_request_id, posts[2].client_request_id, "a new ask after an answer: a new request id");
    const turns = (await api(engine.base, `/api/moments/${id}`)).turns;
    assert.equal(turns.length, 3);
    assert.deepEqual(await Promise.all(turns.map(async (t) => (await api(engine.base, `/api/turns/${t}`)).status)), ["failed", "failed", "done"]);
    assert.equal(countKinds(await opKinds(engine.base))["turn.start"], 3);
    await page.click("#back");
    await until(async () => (await row.getAttribute("data-reading")) === "done", "the feed shows the new reading");
  } finally {
    await context.close();
    await engine.stop();
  }
});

test("a moment with no reading offers to ask for one", { skip, timeout: 60_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const made = await fetch(`${engine.base}/api/moments`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ text: "Ohne Lesung" }) });
    const id = (await made.json()).moment.id;
    const page = await openPage(context, engine.base);
    await openMoment(page, id);
    const button = page.locator("#read-again");
    await button.waitFor();
    assert.equal(await button.textContent(), "Ask for a reading");
    await button.click();
    await page.waitForSelector("#moment-reading[data-status=done]", { timeout: 30_000 });
    assert.equal((await api(engine.base, `/api/moments/${id}`)).turns.length, 1);
  } finally {
    await context.close();
    await engine.stop();
  }
});
