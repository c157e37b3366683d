// The page as an app that opens without the engine (issue 27): loaded once
// online, it opens again from its service worker with the engine stopped
// and in airplane mode, shows the feed as last seen (with the thumbnails
// the person saw) and the outbox, takes a capture, and sends everything
// exactly once when the engine is back. And the worker's cache holds the
// page's shell only: never an answer of the engine's API.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import path from "node:path";
import { api, browserOrSkip, capture, countKinds, launch, openMoment, openPage, opKinds, outDir, photoPng, repo, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

/** The build's shell: its cache's name and paths (web/dist/manifest.json and sw.js, as web/build.mjs wrote them). */
function builtShell() {
  const manifest = JSON.parse(readFileSync(path.join(repo, "web/dist/manifest.json"), "utf8"));
  const worker = readFileSync(path.join(repo, "web/dist/sw.js"), "utf8");
  const paths = [...worker.matchAll(/\["(\/[^"]*)","[0-9a-f]{64}"\]/g)].map((m) => m[1]).sort();
  return { cache: `spark-page-${manifest.shell_version}`, paths };
}

/** Waits until the page's service worker is active (resolves its state). */
async function workerActive(page) {
  // `ready` resolves once a worker is active, which may still be "activating".
  return page.evaluate(async () => {
    const worker = (await navigator.serviceWorker.ready).active;
    if (worker.state === "activating") {
      await new Promise((resolve) => worker.addEventListener("statechange", () => worker.state !== "activating" && resolve()));
    }
    return worker.state;
  });
}

/** Every cache of the origin with the paths of its requests. */
async function cacheStorage(page) {
  return page.evaluate(async () => {
    const out = {};
    for (const name of await caches.keys()) {
      const cache = await caches.open(name);
      out[name] = (await cache.keys()).map((r) => new URL(r.url).pathname + new URL(r.url).search).sort();
    }
    return out;
  });
}

/** The last-seen store: how many moments its snapshot has and how many thumbnails it keeps. */
async function lastSeenCounts(page) {
  return page.evaluate(
    () =>
      new Promise((resolve, reject) => {
        const open = indexedDB.open("spark-last-seen");
        open.onerror = () => reject(open.error);
        open.onsuccess = () => {
          const db = open.result;
          if (!db.objectStoreNames.contains("snapshot")) return resolve({ moments: 0, thumbs: 0 });
          const tx = db.transaction(["snapshot", "thumbs"]);
          const snap = tx.objectStore("snapshot").get("feed");
          const thumbs = tx.objectStore("thumbs").count();
          tx.oncomplete = () => {
            resolve({ moments: snap.result?.moments.length ?? 0, thumbs: thumbs.result });
            db.close();
          };
        };
      }),
  );
}

test("opened once online, the page opens with the engine stopped and in airplane mode: last-seen feed, outbox, capture; all sent exactly once when the engine is back", { skip, timeout: 240_000 }, async () => {
  let engine = await startEngine();
  const { context } = await launch();
  const listen = new URL(engine.base).host;
  try {
    const page = await openPage(context, engine.base);
    assert.equal(await workerActive(page), "activated");
    await capture(page, photoPng(640, 480, 71), "Ausfahrt freihalten");
    await capture(page, photoPng(640, 480, 72), "Bitte nicht rauchen");
    await until(async () => (await page.locator("#feed [data-moment-id]").count()) === 2 && (await page.locator("#feed [data-outbox]").count()) === 0, "both captures sent", 60_000);
    await until(async () => (await page.locator('#feed [data-moment-id][data-reading="done"]').count()) === 2, "both readings", 60_000);
    await until(async () => {
      const c = await lastSeenCounts(page);
      return c.moments === 2 && c.thumbs === 2;
    }, "the feed and both thumbnails kept on the device");
    const seen = await page.locator("#feed [data-moment-id] .title").allTextContents();

    // The engine goes away; a capture made now waits in the outbox.
    await engine.stop({ keepData: true });
    await capture(page, photoPng(640, 480, 73), "vor dem Neuladen");
    await page.waitForSelector('#feed [data-outbox="pending"]');

    // A reload without the engine: the page comes from the worker.
    const answer = await page.reload();
    assert.ok(answer.fromServiceWorker(), "the page came from the service worker");
    await page.waitForSelector("#last-seen");
    assert.deepEqual(await page.locator("#feed [data-moment-id] .title").allTextContents(), seen, "the feed as last seen");
    assert.match(await page.textContent("#last-seen"), /As last seen/);
    // Thumbnails from the device in place of the engine's media.
    await until(async () => (await page.locator('#feed [data-moment-id] img[data-last-seen="true"]').count()) === 2, "the kept thumbnails shown");
    const drawn = await page.$$eval('#feed [data-moment-id] img[data-last-seen="true"]', (imgs) => imgs.map((i) => i.complete && i.naturalWidth > 0));
    assert.deepEqual(drawn, [true, true], "the thumbnails decode");
    await page.waitForSelector('#feed [data-outbox="pending"]');
    assert.match(await page.textContent("#status"), /Can't reach the engine|Reconnecting|Offline/);

    // Airplane mode: no network at all; it opens again and takes a capture.
    await context.setOffline(true);
    assert.ok((await page.reload()).fromServiceWorker());
    await page.waitForSelector("#last-seen");
    assert.equal(await page.locator("#feed [data-moment-id]").count(), 2);
    await until(async () => (await page.textContent("#status")).startsWith("Offline"), "Offline");
    await capture(page, photoPng(640, 480, 74), "im Flugmodus");
    await until(async () => (await page.locator('#feed [data-outbox="pending"]').count()) === 2, "two captures waiting");
    await page.screenshot({ path: path.join(outDir, "offline-start.png") });
    // A moment of the last-seen feed opens, with its thumbnail.
    await openMoment(page, await page.locator("#feed [data-moment-id]").first().getAttribute("data-moment-id"));
    await until(async () => (await page.locator('#moment img[data-last-seen="true"]').count()) === 1, "the moment's kept thumbnail");
    await page.click("#back");

    // The engine is back, at the same address, with its data.
    engine = await startEngine({ listen, dir: engine.dir });
    await context.setOffline(false);
    await until(async () => (await page.locator("#feed [data-outbox]").count()) === 0 && (await page.locator("#feed [data-moment-id]").count()) === 4, "both waiting captures sent and the feed loaded", 90_000);
    await page.waitForSelector("#last-seen", { state: "detached" });
    await until(async () => countKinds(await opKinds(engine.base))["media.put"] === 8, "every original", 60_000);
    const counts = countKinds(await opKinds(engine.base));
    assert.equal(counts["moment.create"], 4, "each capture once");
    assert.equal(counts["turn.start"], 4);
    const texts = (await api(engine.base, "/api/moments?limit=1000")).moments.map((m) => m.text).sort();
    assert.deepEqual(texts, ["Ausfahrt freihalten", "Bitte nicht rauchen", "im Flugmodus", "vor dem Neuladen"]);
    await until(async () => (await lastSeenCounts(page)).moments === 4, "the last-seen feed saved again");
  } finally {
    await context.close();
    await engine.stop();
  }
});

test("the worker's cache holds the page's shell only, never an answer of /api/", { skip, timeout: 120_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  const shell = builtShell();
  try {
    const page = await openPage(context, engine.base);
    await workerActive(page);
    // Every kind of API use the page makes, with the worker controlling it.
    await page.reload();
    await page.waitForSelector("body[data-ready=true]");
    assert.ok(await page.evaluate(() => navigator.serviceWorker.controller !== null), "controlled");
    await capture(page, photoPng(640, 480, 81), "Einfahrt");
    await until(async () => (await page.locator('#feed [data-moment-id][data-reading="done"]').count()) === 1, "the moment and its reading", 60_000);
    const id = await page.locator("#feed [data-moment-id]").first().getAttribute("data-moment-id");
    await openMoment(page, id);
    await page.waitForFunction(() => document.querySelector("#moment img")?.complete);
    await page.fill("#message-body", "was heißt das?");
    await page.click("#message-form button");
    await page.waitForSelector('#thread [data-state="sent"]');
    await page.click('nav button[data-view="recall"]');
    await page.click("#open-log");
    await page.waitForSelector("#head-seq");
    const storage = await cacheStorage(page);
    assert.deepEqual(Object.keys(storage), [shell.cache], "one cache, this build's");
    assert.deepEqual(storage[shell.cache], shell.paths, "exactly the shell");
    for (const [name, paths] of Object.entries(storage)) {
      assert.ok(!paths.some((p) => p.startsWith("/api/")), `${name} holds an /api/ answer: ${paths}`);
    }
    // And the browser's own HTTP cache may hold API answers, but the
    // worker never serves them: offline, an API request fails.
    await context.setOffline(true);
    const offline = await page.evaluate(async (mid) => {
      try {
        const r = await fetch(`/api/moments/${mid}`);
        return `answered ${r.status}`;
      } catch (e) {
        return "failed";
      }
    }, id);
    assert.equal(offline, "failed");
  } finally {
    await context.close();
    await engine.stop();
  }
});
