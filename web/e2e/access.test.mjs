// With a token configured: the page asks for it once and signs in (an
// HttpOnly session cookie, nothing in script-readable storage), the event
// stream works with the cookie, and a cross-origin POST is refused. With
// none (the default): a page of another origin writes nothing either,
// while the engine's own page does.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import path from "node:path";
import { api, browserOrSkip, capture, countKinds, launch, opKinds, outDir, photoPng, startEngine, tokenEntry, until } from "./harness.mjs";

const skip = browserOrSkip();
const TOKEN = "spk_e2e_browser_token";

/** A page on another origin (another port of 127.0.0.1: same site, other origin) that posts to the engine. */
async function otherOrigin(engineBase) {
  const server = http.createServer((req, res) => {
    res.writeHead(200, { "content-type": "text/html" });
    res.end(`<!doctype html><form id="f" method="POST" action="${engineBase}/api/phrases" enctype="text/plain"><input name='{"phrase":"gestohlen","x":"' value='"}'></form>`);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return { base: `http://127.0.0.1:${server.address().port}`, close: () => new Promise((r) => server.close(r)) };
}

test("with a token: sign in once, the event stream works, a cross-origin POST is refused", { skip, timeout: 120_000 }, async () => {
  const engine = await startEngine({ config: tokenEntry("browser", TOKEN) });
  const bearer = { Authorization: `Bearer ${TOKEN}` };
  const evil = await otherOrigin(engine.base);
  const { context } = await launch();
  const urls = [];
  context.on("request", (r) => urls.push(r.url()));
  try {
    const page = await context.newPage();
    await page.goto(engine.base);
    await page.waitForSelector("#signin:not([hidden])");
    await page.screenshot({ path: path.join(outDir, "signin.png") });
    await page.fill("#signin-token", "wrong");
    await page.click("#signin-form button");
    await until(async () => (await page.textContent("#signin-error")).includes("Not signed in"), "the refusal");
    await page.fill("#signin-token", TOKEN);
    await page.click("#signin-form button");
    await page.waitForSelector("body[data-ready=true]");
    // No token or session where a script reads, nor in any URL.
    assert.equal(await page.evaluate(() => document.cookie), "", "the cookie is HttpOnly");
    assert.equal(await page.evaluate(() => localStorage.length + sessionStorage.length), 0);
    assert.ok(!urls.some((u) => u.includes(TOKEN)), "no token in a URL");
    const cookies = await context.cookies();
    const session = cookies.find((c) => c.name === "spark_session");
    assert.ok(session, "the session cookie");
    assert.equal(session.httpOnly, true);
    assert.equal(session.sameSite, "Strict");
    assert.notEqual(session.value, TOKEN);

    // Capture through the page: writes with the cookie, same-origin.
    await capture(page, photoPng(640, 480, 51), "Mit Anmeldung");
    await until(async () => (await page.locator('#feed [data-moment-id][data-reading="done"]').count()) === 1, "the moment and its reading");
    // The event stream with the cookie: a moment made elsewhere (with the
    // token) appears live.
    const made = await fetch(`${engine.base}/api/moments`, { method: "POST", headers: { ...bearer, "content-type": "application/json" }, body: JSON.stringify({ text: "von woanders" }) });
    const other = (await made.json()).moment.id;
    await page.waitForSelector(`#feed [data-moment-id="${other}"]`, { timeout: 15_000 });
    // Media downloads with the cookie: the copy shows.
    const loaded = await page.locator("#feed img").first().evaluate((img) => img.complete && img.naturalWidth > 0);
    assert.ok(loaded, "the copy image loads with the cookie");

    // A cross-origin form POST with the cookie is refused, and writes nothing.
    const before = (await api(engine.base, "/api/log/head", bearer)).seq;
    const evilPage = await context.newPage();
    await evilPage.goto(evil.base);
    const [answer] = await Promise.all([evilPage.waitForResponse((r) => r.url().startsWith(`${engine.base}/api/phrases`)), evilPage.evaluate(() => document.getElementById("f").submit())]);
    assert.equal(answer.status(), 403);
    assert.equal((await answer.json()).code, "forbidden");
    // And a cross-origin fetch with credentials (from the other origin again:
    // the form's answer navigated the tab to the engine's).
    await evilPage.goto(evil.base);
    const refused = evilPage.waitForResponse((r) => r.url() === `${engine.base}/api/moments`);
    const status = await evilPage.evaluate(async (base) => {
      try {
        const r = await fetch(`${base}/api/moments`, { method: "POST", credentials: "include", mode: "no-cors", headers: { "content-type": "text/plain" }, body: '{"text":"gestohlen"}' });
        return r.type;
      } catch (e) {
        return String(e);
      }
    }, engine.base);
    assert.equal(status, "opaque");
    assert.equal((await refused).status(), 403);
    await new Promise((r) => setTimeout(r, 500));
    assert.equal((await api(engine.base, "/api/log/head", bearer)).seq, before, "nothing was written");
    assert.deepEqual((await api(engine.base, "/api/phrases", bearer)).marks, []);
    assert.equal(countKinds(await opKinds(engine.base, bearer))["moment.create"], 2);

    // The token ends every session made with it: the page's next send
    // answers 401, the capture waits, and the page asks for the token again.
    // (The capture is stored while its create cannot get through, so that
    // it waits whichever notices the end first: the send or the event stream.)
    await page.route("**/api/moments", (route) => (route.request().method() === "POST" ? route.abort("connectionfailed") : route.continue()));
    await capture(page, photoPng(640, 480, 52), "nach dem Abmelden");
    await page.waitForSelector('#feed [data-outbox="pending"]');
    const ended = await fetch(`${engine.base}/api/session`, { method: "DELETE", headers: bearer });
    assert.equal((await ended.json()).revoked, 1);
    await evilPage.close();
    await page.unroute("**/api/moments");
    await page.waitForSelector("#signin:not([hidden])", { timeout: 30_000 });
    assert.equal(countKinds(await opKinds(engine.base, bearer))["moment.create"], 2, "nothing written without a session");
    await page.fill("#signin-token", TOKEN);
    await page.click("#signin-form button");
    await until(async () => countKinds(await opKinds(engine.base, bearer))["moment.create"] === 3, "the waiting capture, sent after signing in again", 30_000);
  } finally {
    await context.close();
    await evil.close();
    await engine.stop();
  }
});

test("without a token: a page of another origin writes nothing, the engine's own page does", { skip, timeout: 120_000 }, async () => {
  const engine = await startEngine();
  const evil = await otherOrigin(engine.base);
  const { context } = await launch();
  try {
    // The engine's page writes (its requests carry its own Origin).
    const page = await context.newPage();
    await page.goto(engine.base);
    await page.waitForSelector("body[data-ready=true]");
    await capture(page, photoPng(640, 480, 53), "Ohne Token");
    await until(async () => (await page.locator('#feed [data-moment-id][data-reading="done"]').count()) === 1, "the moment and its reading");

    // The break-it request as a page of another origin sends it: a no-cors
    // fetch with a text/plain body, which needs no CORS preflight.
    const evilPage = await context.newPage();
    await evilPage.goto(evil.base);
    const refused = evilPage.waitForResponse((r) => r.url() === `${engine.base}/api/moments`);
    const type = await evilPage.evaluate(async (base) => {
      const r = await fetch(`${base}/api/moments`, { method: "POST", mode: "no-cors", body: '{"text":"written by evil.example"}' });
      return r.type;
    }, engine.base);
    assert.equal(type, "opaque");
    const answer = await refused;
    assert.equal(answer.status(), 403);
    // And a text/plain form POST.
    const [posted] = await Promise.all([evilPage.waitForResponse((r) => r.url().startsWith(`${engine.base}/api/phrases`)), evilPage.evaluate(() => document.getElementById("f").submit())]);
    assert.equal(posted.status(), 403);
    assert.equal((await posted.json()).code, "forbidden");
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(countKinds(await opKinds(engine.base))["moment.create"], 1, "only the page's moment");
    assert.deepEqual((await api(engine.base, "/api/phrases")).marks, []);
    await evilPage.close();
  } finally {
    await context.close();
    await evil.close();
    await engine.stop();
  }
});
