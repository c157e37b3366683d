// The engine ships a new page (issue 27): a second build of the page is
// made here with web/build.mjs from changed sources, and a proxy in front
// of the real engine serves that build's files (with the engine's own
// headers) in place of the engine's: what a browser sees when the engine
// binary is replaced, at the same address. The browser's worker then:
// refuses a mixed shell (a new /sw.js whose assets are the old build's),
// installs the new build and waits while a page runs the old one (which
// keeps opening whole: old HTML, old style, old script), takes over on
// "Reload", and deletes the old build's cache.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { cpSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync, existsSync } from "node:fs";
import { createHash } from "node:crypto";
import http from "node:http";
import { tmpdir } from "node:os";
import path from "node:path";
import { browserOrSkip, launch, openPage, outDir, repo, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();
const web = path.join(repo, "web");

/**
 * Builds a changed page with web/build.mjs in a scratch copy of its
 * sources: another title, a style rule and a line of script that mark it.
 * Returns the built dist/ directory and its shell version.
 */
function buildNext() {
  const root = mkdtempSync(path.join(tmpdir(), "spark-next-page-"));
  const copy = path.join(root, "web");
  cpSync(path.join(web, "page"), path.join(copy, "page"), { recursive: true });
  cpSync(path.join(web, "client/src"), path.join(copy, "client/src"), { recursive: true });
  for (const file of ["client/package-lock.json", "client/package.json", "build.mjs", "package.json"]) cpSync(path.join(web, file), path.join(copy, file));
  symlinkSync(path.join(web, "node_modules"), path.join(copy, "node_modules"));
  symlinkSync(path.join(web, "client/node_modules"), path.join(copy, "client/node_modules"));
  const edit = (file, change) => writeFileSync(path.join(copy, file), change(readFileSync(path.join(copy, file), "utf8")));
  edit("page/index.html", (s) => s.replace("<title>Spark</title>", "<title>Spark (next)</title>"));
  edit("page/src/app.css", (s) => `${s}:root { --build: next; }\n`);
  edit("page/src/main.ts", (s) => `${s}\ndocument.documentElement.dataset.build = "next";\n`);
  execFileSync(process.execPath, [path.join(copy, "build.mjs")], { stdio: "pipe" });
  const dist = path.join(copy, "dist");
  const version = JSON.parse(readFileSync(path.join(dist, "manifest.json"), "utf8")).shell_version;
  return { root, dist, version };
}

/** The dist/ file of a page path, or null for a path that is not the page's. */
function distFile(pathname) {
  if (pathname === "/") return "index.html";
  if (pathname === "/sw.js" || pathname === "/app.webmanifest") return pathname.slice(1);
  if (/^\/assets\/[A-Za-z0-9._-]+$/.test(pathname)) return pathname.slice(1);
  return null;
}

/**
 * A proxy to the engine that, for the page's paths `serveNext(path)`
 * picks, answers the next build's bytes with the engine's headers (type,
 * Cache-Control, CSP, Service-Worker-Allowed) and the bytes' SHA-256 as
 * ETag, as the engine does for its own build.
 */
async function pageProxy(target, nextDist) {
  const upstream = new URL(target);
  const state = { serveNext: () => false };
  const server = http.createServer((req, res) => {
    const pathname = new URL(req.url, "http://x").pathname;
    const file = distFile(pathname);
    const next = file && state.serveNext(pathname) && existsSync(path.join(nextDist, file)) ? readFileSync(path.join(nextDist, file)) : null;
    const headers = { ...req.headers, host: upstream.host };
    if (next) delete headers["if-none-match"];
    const forward = http.request({ host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers }, (answer) => {
      if (!next || answer.statusCode !== 200) {
        res.writeHead(answer.statusCode, answer.headers);
        answer.pipe(res);
        return;
      }
      answer.resume();
      const etag = `"${createHash("sha256").update(next).digest("hex")}"`;
      const out = { ...answer.headers, etag, "content-length": String(next.length) };
      if (req.headers["if-none-match"] === etag) {
        delete out["content-length"];
        res.writeHead(304, out);
        res.end();
      } else {
        res.writeHead(200, out);
        res.end(next);
      }
    });
    forward.on("error", () => req.socket.destroy());
    req.pipe(forward);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    base: `http://127.0.0.1:${server.address().port}`,
    state,
    close: () => new Promise((r) => { server.closeAllConnections(); server.close(r); }),
  };
}

/** Asks the browser to check /sw.js now; resolves the new worker's last state ("installed" or "redundant"), or "none" when there was no new worker. */
async function checkForUpdate(page) {
  return page.evaluate(async () => {
    const registration = await navigator.serviceWorker.getRegistration();
    const settled = new Promise((resolve) => {
      registration.addEventListener(
        "updatefound",
        () => {
          const worker = registration.installing;
          const done = () => {
            if (worker.state === "installed" || worker.state === "activated" || worker.state === "redundant") resolve(worker.state);
          };
          worker.addEventListener("statechange", done);
          done();
        },
        { once: true },
      );
    });
    await registration.update().catch(() => undefined);
    if (!registration.installing && !registration.waiting) {
      // update() found the same script: no new worker.
      const race = await Promise.race([settled, new Promise((r) => setTimeout(() => r("none"), 2000))]);
      return race;
    }
    return settled;
  });
}

/** What the page runs: its title, its style's mark, its script's mark. */
async function running(page) {
  return page.evaluate(() => ({
    title: document.title,
    style: getComputedStyle(document.documentElement).getPropertyValue("--build").trim(),
    script: document.documentElement.dataset.build ?? "",
  }));
}

async function cacheNames(page) {
  return page.evaluate(async () => (await caches.keys()).sort());
}

test("a new build of the page: a mixed shell is refused, the new worker waits, takes over on Reload, and the old cache is gone", { skip, timeout: 180_000 }, async () => {
  const engine = await startEngine();
  const next = buildNext();
  const proxy = await pageProxy(engine.base, next.dist);
  const { context } = await launch();
  const current = `spark-page-${JSON.parse(readFileSync(path.join(web, "dist/manifest.json"), "utf8")).shell_version}`;
  const nextCache = `spark-page-${next.version}`;
  assert.notEqual(current, nextCache, "the changed build has another version");
  const OLD = { title: "Spark", style: "", script: "" };
  const NEW = { title: "Spark (next)", style: "next", script: "next" };
  try {
    const page = await openPage(context, proxy.base);
    await page.evaluate(async () => (await navigator.serviceWorker.ready).active.state);
    await page.reload();
    await page.waitForSelector("body[data-ready=true]");
    assert.deepEqual(await running(page), OLD);
    assert.deepEqual(await cacheNames(page), [current]);

    // A new worker whose shell the engine does not serve (the old build's
    // assets): its install fails, nothing of it stays, the page is whole.
    proxy.state.serveNext = (p) => p === "/sw.js";
    assert.equal(await checkForUpdate(page), "redundant", "the mixed shell is refused");
    assert.deepEqual(await cacheNames(page), [current], "no cache of the refused worker");
    assert.equal(await page.locator("#update").count(), 0, "nothing offered");

    // The engine ships the next build, whole.
    proxy.state.serveNext = () => true;
    assert.equal(await checkForUpdate(page), "installed", "the next build installs and waits");
    await page.waitForSelector("#update");
    assert.match(await page.textContent("#update"), /A new version of the page is ready/);
    assert.deepEqual((await cacheNames(page)).sort(), [current, nextCache].sort(), "both while the new one waits");
    // While it waits, the page keeps opening as the old build, whole.
    await page.reload();
    await page.waitForSelector("body[data-ready=true]");
    assert.deepEqual(await running(page), OLD, "the old build, not a mix");
    await page.waitForSelector("#update");
    await page.screenshot({ path: path.join(outDir, "update-offered.png") });

    // Reload: the new worker takes over and the page reloads as the new build.
    const reloaded = page.waitForEvent("load");
    await page.click("#update button");
    await reloaded;
    await page.waitForSelector("body[data-ready=true]");
    await until(async () => JSON.stringify(await running(page)) === JSON.stringify(NEW), "the new build running");
    assert.deepEqual(await cacheNames(page), [nextCache], "the old build's cache is gone");
    // Every cached file is the next build's.
    const cached = await page.evaluate(async (name) => {
      const cache = await caches.open(name);
      const out = {};
      for (const request of await cache.keys()) {
        const bytes = new Uint8Array(await (await cache.match(request)).arrayBuffer());
        out[new URL(request.url).pathname] = [...new Uint8Array(await crypto.subtle.digest("SHA-256", bytes))].map((b) => b.toString(16).padStart(2, "0")).join("");
      }
      return out;
    }, nextCache);
    for (const [pathname, sha256] of Object.entries(cached)) {
      const file = readFileSync(path.join(next.dist, distFile(pathname)));
      assert.equal(sha256, createHash("sha256").update(file).digest("hex"), pathname);
    }
    assert.equal(await page.locator("#update").count(), 0, "no offer once current");
    // And it opens offline as the new build.
    await context.setOffline(true);
    await page.reload();
    assert.deepEqual(await running(page), NEW);
  } finally {
    await context.close();
    await proxy.close();
    await engine.stop();
    rmSync(next.root, { recursive: true, force: true });
  }
});
