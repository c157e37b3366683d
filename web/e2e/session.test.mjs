// The end of a session: the page hides what the session showed, asks for
// the token again without a stale error or a raw HTTP line, and sends what
// waited once signed in; "Sign out" ends the session on the engine.
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { browserOrSkip, capture, countKinds, launch, opKinds, outDir, photoPng, startEngine, tokenEntry, until } from "./harness.mjs";

const skip = browserOrSkip();
const TOKEN = "spk_e2e_session_token";

test("a session ended elsewhere: sign-in without stale errors, the feed hidden; Sign out ends the session on the engine", { skip, timeout: 120_000 }, async () => {
  const engine = await startEngine({ config: tokenEntry("browser", TOKEN) });
  const bearer = { Authorization: `Bearer ${TOKEN}` };
  const { context } = await launch();
  try {
    const page = await context.newPage();
    await page.goto(engine.base);
    await page.waitForSelector("#signin:not([hidden])");
    await page.fill("#signin-token", "wrong");
    await page.click("#signin-form button");
    await until(async () => (await page.textContent("#signin-error")).includes("not valid"), "the refusal");
    await page.fill("#signin-token", TOKEN);
    await page.click("#signin-form button");
    await page.waitForSelector("body[data-ready=true]");
    await capture(page, photoPng(640, 480, 81), "angemeldet");
    await until(async () => (await page.locator("#feed [data-moment-id]").count()) === 1, "the moment");

    // A capture waits (its create cannot get through); the token ends every
    // session made with it; the page notices (the send's 401 or the event stream's).
    await page.route("**/api/moments", (route) => (route.request().method() === "POST" ? route.abort("connectionfailed") : route.continue()));
    await capture(page, photoPng(640, 480, 82), "abgemeldet");
    await page.waitForSelector('#feed [data-outbox="pending"]');
    await fetch(`${engine.base}/api/session`, { method: "DELETE", headers: bearer });
    await page.unroute("**/api/moments");
    await page.waitForSelector("#signin:not([hidden])", { timeout: 30_000 });
    assert.equal(await page.textContent("#signin-error"), "", "no stale error");
    assert.match(await page.textContent("#signin-why"), /session ended/);
    assert.match(await page.textContent("#signin-waiting"), /1 capture wait/);
    assert.equal(await page.locator("#feed [data-moment-id]").count(), 0, "the feed is not shown");
    assert.ok(await page.locator("#app").isHidden(), "the views are hidden");
    const visible = await page.evaluate(() => document.body.innerText);
    assert.doesNotMatch(visible, /Bearer|HTTP 401/, "no raw HTTP line");
    await page.screenshot({ path: path.join(outDir, "session-ended.png") });
    await page.fill("#signin-token", TOKEN);
    await page.click("#signin-form button");
    await until(async () => countKinds(await opKinds(engine.base, bearer))["moment.create"] === 2, "the waiting capture sent after signing in", 30_000);
    await until(async () => (await page.locator("#feed [data-moment-id]").count()) === 2, "the feed again");

    // Sign out: the engine ends the session, and the page asks for a token.
    await page.click("#signout");
    await page.waitForSelector("#signin:not([hidden])");
    assert.match(await page.textContent("#signin-why"), /signed out/);
    assert.equal(await page.locator("#feed [data-moment-id]").count(), 0);
    const status = await page.evaluate(() => fetch("/api/log/head", { headers: { "X-Spark-Client": "web" } }).then((r) => r.status));
    assert.equal(status, 401, "the session is ended on the engine");
    assert.ok(!(await context.cookies()).some((c) => c.name === "spark_session" && c.value), "the cookie is cleared");
  } finally {
    await context.close();
    await engine.stop();
  }
});

test("a session ended while the page is idle is noticed from the event stream, with no write", { skip, timeout: 60_000 }, async () => {
  const engine = await startEngine({ config: tokenEntry("browser", TOKEN) });
  const { context } = await launch();
  try {
    const page = await context.newPage();
    await page.goto(engine.base);
    await page.waitForSelector("#signin:not([hidden])");
    await page.fill("#signin-token", TOKEN);
    await page.click("#signin-form button");
    await page.waitForSelector("body[data-ready=true]");
    await until(async () => (await page.textContent("#status")).startsWith("Online"), "Online");
    await fetch(`${engine.base}/api/session`, { method: "DELETE", headers: { Authorization: `Bearer ${TOKEN}` } });
    await page.waitForSelector("#signin:not([hidden])", { timeout: 15_000 });
    assert.match(await page.textContent("#signin-why"), /session ended/);
  } finally {
    await context.close();
    await engine.stop();
  }
});

test("without tokens there is no Sign out", { skip, timeout: 60_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const page = await context.newPage();
    await page.goto(engine.base);
    await page.waitForSelector("body[data-ready=true]");
    await new Promise((r) => setTimeout(r, 500));
    assert.ok(await page.locator("#signout").isHidden());
  } finally {
    await context.close();
    await engine.stop();
  }
});
