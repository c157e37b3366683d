// Editing and deleting a moment from the page, with If-Match: a change
// made elsewhere meanwhile is never overwritten (412: the page shows the
// moment as it is now and says so, keeping what was typed in the form).
import { test } from "node:test";
import assert from "node:assert/strict";
import { api, browserOrSkip, launch, openMoment, openPage, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

test("edit and delete a moment from the page; a stale edit is refused, not applied", { skip, timeout: 60_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const made = await fetch(`${engine.base}/api/moments`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ text: "Ausfahrt frei" }) });
    const id = (await made.json()).moment.id;
    const page = await openPage(context, engine.base);
    page.on("dialog", (d) => void d.accept());
    await openMoment(page, id);
    await page.click("#edit-open");
    assert.equal(await page.inputValue("#edit-text"), "Ausfahrt frei");
    await page.fill("#edit-text", "Ausfahrt freihalten");
    await page.fill("#edit-caption", "am Tor");
    await page.click("#edit-form button[type=submit]");
    await until(async () => (await page.textContent("#edit-status")) === "Saved.", "Saved.");
    let moment = await api(engine.base, `/api/moments/${id}`);
    assert.equal(moment.text, "Ausfahrt freihalten");
    assert.equal(moment.caption, "am Tor");
    await until(async () => (await page.textContent("#moment h2")) === "Ausfahrt freihalten", "the view shows the edit");

    // Changed elsewhere while the page's form is open: the page's edit is refused.
    await page.click("#edit-open");
    await page.fill("#edit-text", "von der Seite");
    const elsewhere = await fetch(`${engine.base}/api/moments/${id}`, { method: "PATCH", headers: { "content-type": "application/json" }, body: JSON.stringify({ text: "von woanders" }) });
    assert.equal(elsewhere.status, 200);
    await page.click("#edit-form button[type=submit]");
    await until(async () => (await page.textContent("#edit-status")).includes("changed elsewhere"), "the refusal");
    moment = await api(engine.base, `/api/moments/${id}`);
    assert.equal(moment.text, "von woanders", "the other change stays");
    await until(async () => (await page.textContent("#moment h2")) === "von woanders", "the view shows the moment as it is now");
    // What was typed is kept in the form, to save again or cancel.
    assert.equal(await page.isVisible("#edit-form"), true, "the edit form stays open");
    assert.equal(await page.inputValue("#edit-text"), "von der Seite", "the draft is kept");
    await page.click("#edit-cancel");

    // Delete.
    await page.click("#delete-moment");
    await page.waitForSelector("#view-moments:not([hidden])");
    const gone = await fetch(`${engine.base}/api/moments/${id}`);
    assert.equal(gone.status, 410);
    await until(async () => (await page.locator("#feed [data-moment-id]").count()) === 0, "the row gone");
  } finally {
    await context.close();
    await engine.stop();
  }
});
