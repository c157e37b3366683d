// The end-to-end harness: the real spark-engine binary on 127.0.0.1:0,
// Debian's Chromium driven by playwright-core (no browser download), a
// lossy proxy, photos made here, and reads of the engine's own state.
//
// Chromium: SPARK_CHROMIUM, else /usr/bin/chromium (Debian's package). The
// engine: SPARK_ENGINE_BIN, else the newer of target/release and
// target/debug spark-engine (build one first: `cargo build`). Without
// Chromium every test is skipped and says so, unless
// SPARK_REQUIRE_BROWSER=1 (CI), where a missing browser fails.
import { spawn } from "node:child_process";
import { existsSync, statSync, mkdtempSync, writeFileSync, mkdirSync, rmSync, readFileSync } from "node:fs";
import { createHash, randomBytes } from "node:crypto";
import http from "node:http";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import zlib from "node:zlib";
import { chromium } from "playwright-core";

const here = path.dirname(fileURLToPath(import.meta.url));
export const repo = path.resolve(here, "../..");
export const outDir = path.join(here, "out");
mkdirSync(outDir, { recursive: true });

export const CHROMIUM_ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

/** The Chromium executable, or null. */
export function chromiumPath() {
  if (process.env.SPARK_CHROMIUM) return existsSync(process.env.SPARK_CHROMIUM) ? process.env.SPARK_CHROMIUM : null;
  for (const p of ["/usr/bin/chromium", "/usr/bin/chromium-browser"]) {
    if (existsSync(p)) return p;
  }
  return null;
}

/**
 * `{ skip }` for node:test: a reason to skip when Chromium is missing
 * (printed), or false. With SPARK_REQUIRE_BROWSER=1 a missing browser
 * throws instead, so CI cannot pass without running these tests.
 */
export function browserOrSkip() {
  if (chromiumPath()) return false;
  const why = "skipped: no Chromium at /usr/bin/chromium (apt-get install chromium, or set SPARK_CHROMIUM; set SPARK_REQUIRE_BROWSER=1 to make this a failure)";
  if (process.env.SPARK_REQUIRE_BROWSER === "1") throw new Error(`SPARK_REQUIRE_BROWSER=1 but ${why}`);
  console.log(why);
  return why;
}

/** The spark-engine binary to run. */
export function engineBinary() {
  if (process.env.SPARK_ENGINE_BIN) return process.env.SPARK_ENGINE_BIN;
  const candidates = ["release", "debug"].map((p) => path.join(repo, "target", p, "spark-engine")).filter(existsSync);
  if (!candidates.length) throw new Error("no target/{release,debug}/spark-engine: run `cargo build` first (or set SPARK_ENGINE_BIN)");
  return candidates.sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs)[0];
}

/** A configuration whose one brain seat is the offline brain with OCR off: a moment without text cannot be read (its turn fails). */
export const NO_OCR = `[[brains.seats]]\nname = "pippa"\nadapter = "local"\nocr = false\n`;

/** A token's configuration line: its SHA-256, as `spark-engine token add` stores it. */
export function tokenEntry(device, token) {
  return `[[access.tokens]]\ndevice = "${device}"\nsha256 = "${createHash("sha256").update(token).digest("hex")}"\n`;
}

/**
 * Starts the engine on `listen` (127.0.0.1:0) over a fresh data directory,
 * or over `dir` when given (a restart: pass the `dir` and the address of
 * an engine stopped with `keepData`), or over `data` (which stop() leaves);
 * resolves once it printed its address. `bin` runs another binary;
 * `checkPage: false` skips the check that it embeds web/dist/ (a
 * measurement of another build's page).
 */
export async function startEngine({ config = "", listen = "127.0.0.1:0", dir = mkdtempSync(path.join(tmpdir(), "spark-e2e-")), bin = engineBinary(), data = null, checkPage = true } = {}) {
  const args = ["--listen", listen, "--data", data ?? path.join(dir, "data")];
  if (config) {
    writeFileSync(path.join(dir, "spark.toml"), config);
    args.push("--config", path.join(dir, "spark.toml"));
  }
  const child = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, RUST_LOG: "warn" } });
  let output = "";
  const base = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the engine printed no address in 30 s:\n${output}`)), 30_000);
    const read = (chunk) => {
      output += chunk;
      const m = output.match(/spark-engine listening on (http:\/\/[^\s]+)/);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    };
    child.stdout.on("data", read);
    child.stderr.on("data", read);
    child.on("exit", (code) => reject(new Error(`the engine exited (${code}):\n${output}`)));
  });
  // The binary embeds web/dist/ at compile time: one built before the
  // last page build would test an older page.
  const served = Buffer.from(await (await fetch(`${base}/assets/app.js`)).arrayBuffer());
  if (checkPage && !served.equals(readFileSync(path.join(repo, "web/dist/assets/app.js")))) {
    child.kill("SIGTERM");
    throw new Error(`${bin} embeds another build of the page than web/dist/: rebuild it (cargo build)`);
  }
  return {
    base,
    child,
    dir,
    /** Stops the engine; removes its data directory unless `keepData`. */
    async stop({ keepData = false } = {}) {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill("SIGTERM");
        await exited;
      }
      if (!keepData) rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A persistent Chromium profile (a fresh one unless `userDataDir` is given). */
export async function launch(userDataDir = mkdtempSync(path.join(tmpdir(), "spark-profile-"))) {
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: chromiumPath(),
    headless: true,
    args: CHROMIUM_ARGS,
    viewport: { width: 412, height: 860 },
    deviceScaleFactor: 1,
  });
  return { context, userDataDir };
}

/** Reads the engine with `headers` (a bearer token when configured). */
export async function api(base, pathname, headers = {}) {
  const answer = await fetch(new URL(pathname, base), { headers });
  if (!answer.ok) throw new Error(`GET ${pathname}: ${answer.status} ${await answer.text()}`);
  return answer.json();
}

/** The kinds of every committed op, in seq order, read off /api/events up to the head. */
export async function opKinds(base, headers = {}) {
  const head = await api(base, "/api/log/head", headers);
  if (head.seq === 0) return [];
  const controller = new AbortController();
  const answer = await fetch(new URL("/api/events?after=0", base), { headers, signal: controller.signal });
  const kinds = [];
  let buffer = "";
  const decoder = new TextDecoder();
  const reader = answer.body.getReader();
  for (;;) {
    const { value: chunk, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(chunk, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").find((l) => l.startsWith("data:"));
      if (!data) continue;
      const notice = JSON.parse(data.slice(5));
      kinds.push(notice);
      if (notice.seq >= head.seq) {
        await reader.cancel().catch(() => {});
        controller.abort();
        return kinds;
      }
    }
  }
  return kinds;
}

/** How many ops of each kind. */
export function countKinds(notices) {
  const counts = {};
  for (const n of notices) counts[n.kind] = (counts[n.kind] ?? 0) + 1;
  return counts;
}

/**
 * A proxy in front of the engine that forwards every request and, for
 * every second write (POST, PUT, PATCH, DELETE under /api/), drops the
 * answer after the engine has made it: the client sees a network error
 * for a write that happened.
 */
export async function lossyProxy(target) {
  const upstream = new URL(target);
  let writes = 0;
  const stats = { forwarded: 0, dropped: 0 };
  const server = http.createServer((req, res) => {
    const isWrite = req.method !== "GET" && req.method !== "HEAD" && req.url.startsWith("/api/");
    const drop = isWrite && writes++ % 2 === 0;
    const forward = http.request(
      { host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers: { ...req.headers, host: req.headers.host } },
      (answer) => {
        stats.forwarded += 1;
        if (drop) {
          // Read the whole answer (the engine has committed), then cut the client off.
          answer.resume();
          answer.on("end", () => {
            stats.dropped += 1;
            req.socket.destroy();
          });
          return;
        }
        res.writeHead(answer.statusCode, answer.headers);
        answer.pipe(res);
      },
    );
    forward.on("error", () => req.socket.destroy());
    req.pipe(forward);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    base: `http://127.0.0.1:${server.address().port}`,
    stats,
    close: () => new Promise((r) => { server.closeAllConnections(); server.close(r); }),
  };
}

function crc32(buf) {
  let c, crc = 0xffffffff;
  for (let n = 0; n < buf.length; n++) {
    c = (crc ^ buf[n]) & 0xff;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    crc = (crc >>> 8) ^ c;
  }
  return (crc ^ 0xffffffff) >>> 0;
}

/** One PNG chunk: its length, type, data and CRC-32. */
function chunk(type, data) {
  const len = Buffer.alloc(4);
  len.writeUInt32BE(data.length);
  const body = Buffer.concat([Buffer.from(type), data]);
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(body));
  return Buffer.concat([len, body, crc]);
}

/** A PNG photo of `width` x `height` px with a pattern seeded by `seed` (so every photo has its own bytes). */
export function photoPng(width = 1600, height = 1200, seed = 1) {
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr[8] = 8; ihdr[9] = 2; ihdr[10] = 0; ihdr[11] = 0; ihdr[12] = 0;
  const raw = Buffer.alloc((width * 3 + 1) * height);
  for (let y = 0; y < height; y++) {
    const row = y * (width * 3 + 1);
    raw[row] = 0;
    for (let x = 0; x < width; x++) {
      const i = row + 1 + x * 3;
      const band = ((x >> 6) + (y >> 6) + seed) % 3;
      raw[i] = band === 0 ? 230 : 40 + (seed * 37) % 200;
      raw[i + 1] = band === 1 ? 200 : 60;
      raw[i + 2] = band === 2 ? 220 : (x * seed) & 0xff;
    }
  }
  const sig = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  return Buffer.concat([sig, chunk("IHDR", ihdr), chunk("IDAT", zlib.deflateSync(raw)), chunk("IEND", Buffer.alloc(0))]);
}

/** A PNG of `width` x `height` px of random pixels: it does not compress, so its size is about 3 bytes a pixel. */
export function noisePng(width, height) {
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr[8] = 8; ihdr[9] = 2;
  const raw = randomBytes((width * 3 + 1) * height);
  for (let y = 0; y < height; y++) raw[y * (width * 3 + 1)] = 0;
  const sig = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  return Buffer.concat([sig, chunk("IHDR", ihdr), chunk("IDAT", zlib.deflateSync(raw, { level: 1 })), chunk("IEND", Buffer.alloc(0))]);
}

/** Opens the moment `id` from the feed. */
export async function openMoment(page, id) {
  await page.locator(`#feed [data-moment-id="${id}"]`).click();
  await page.waitForSelector("#view-moment:not([hidden])");
}

/** The WCAG contrast ratio of two CSS `rgb()`/`rgba()` colours (the alpha is ignored). */
export function contrast(a, b) {
  const lum = (css) => {
    const [r, g, bl] = css.match(/[\d.]+/g).slice(0, 3).map(Number).map((v) => {
      const c = v / 255;
      return c <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * bl;
  };
  const [hi, lo] = [lum(a), lum(b)].sort((x, y) => y - x);
  return (hi + 0.05) / (lo + 0.05);
}

/** The width and height in a JPEG's first SOF marker. */
export function jpegSize(bytes) {
  let i = 2;
  while (i < bytes.length) {
    if (bytes[i] !== 0xff) { i++; continue; }
    const marker = bytes[i + 1];
    const len = bytes.readUInt16BE(i + 2);
    if (marker >= 0xc0 && marker <= 0xcf && ![0xc4, 0xc8, 0xcc].includes(marker)) {
      return { height: bytes.readUInt16BE(i + 5), width: bytes.readUInt16BE(i + 7) };
    }
    i += 2 + len;
  }
  return null;
}

/** Opens the page at `base` and waits until it has loaded its feed. */
export async function openPage(context, base) {
  const page = await context.newPage();
  await page.goto(base);
  await page.waitForSelector("body[data-ready=true]", { timeout: 15_000 });
  return page;
}

/** Captures `photo` through the page as a person does: the photo (the camera's file input), its preview, the text, then Save; resolves once Save took them. */
export async function capture(page, photo, text, name = "sign.png") {
  await page.setInputFiles("#capture-file", { name, mimeType: "image/png", buffer: photo });
  await page.waitForSelector("#capture-preview img");
  await page.fill("#capture-text", text);
  await page.click("#capture-save");
  await page.waitForSelector("#capture-form[data-photos='0']", { state: "attached" });
  await until(async () => (await page.inputValue("#capture-text")) === "", "Save to take the text");
}

/** Every record of the object store `store` of the page's IndexedDB database `db` (default the outbox's), read in the page. */
export function idbRecords(page, store, db = "spark-outbox") {
  return page.evaluate(([db, store]) => new Promise((resolve, reject) => {
    const open = indexedDB.open(db);
    open.onsuccess = () => {
      const all = open.result.transaction(store).objectStore(store).getAll();
      all.onsuccess = () => { open.result.close(); resolve(all.result); };
      all.onerror = () => reject(all.error);
    };
    open.onerror = () => reject(open.error);
  }), [db, store]);
}

/** How many records each of `stores` of the page's IndexedDB database `db` holds (a store the database lacks counts 0): `{ [store]: count }`. */
export function idbCounts(page, stores, db = "spark-outbox") {
  return page.evaluate(([db, stores]) => new Promise((resolve, reject) => {
    const open = indexedDB.open(db);
    open.onsuccess = () => {
      const out = Object.fromEntries(stores.map((name) => [name, 0]));
      const present = stores.filter((name) => open.result.objectStoreNames.contains(name));
      if (!present.length) { open.result.close(); return resolve(out); }
      const tx = open.result.transaction(present);
      for (const name of present) {
        const count = tx.objectStore(name).count();
        count.onsuccess = () => (out[name] = count.result);
      }
      tx.oncomplete = () => { open.result.close(); resolve(out); };
      tx.onerror = () => reject(tx.error);
    };
    open.onerror = () => reject(open.error);
  }), [db, stores]);
}

/** Waits until `predicate()` (async) is true, polling. */
export async function until(predicate, what, timeoutMs = 30_000) {
  const start = Date.now();
  let last;
  for (;;) {
    try {
      last = await predicate();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() - start > timeoutMs) throw new Error(`timed out waiting for ${what} (last: ${last})`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** An init script that moves the page's clock (Date and Date.now) by `globalThis.__sparkClockOffsetMs`. */
export function clockScript(offsetMs) {
  return `(() => {
    globalThis.__sparkClockOffsetMs = ${offsetMs};
    const RealDate = Date;
    const realNow = RealDate.now.bind(RealDate);
    const shifted = () => realNow() + globalThis.__sparkClockOffsetMs;
    class ShiftedDate extends RealDate {
      constructor(...args) { if (args.length === 0) super(shifted()); else super(...args); }
      static now() { return shifted(); }
    }
    globalThis.Date = ShiftedDate;
  })();`;
}

const CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/** A ULID whose time is `ms` (Unix milliseconds), with random bits: an id minted at that time (ids sort by time). */
export function ulidAt(ms) {
  let time = "";
  for (let t = ms, i = 0; i < 10; i++, t = Math.floor(t / 32)) time = CROCKFORD[t % 32] + time;
  const random = [...randomBytes(16)].map((b) => CROCKFORD[b % 32]).join("");
  return time + random;
}

/** Creates `count` moments through the API, one `ms` apart in id time ending now, each with its practical reading; resolves to their ids, oldest first. */
export async function seedMoments(base, count, { text = (i) => `Schild ${i}`, reading = true, headers = {} } = {}) {
  const now = Date.now();
  const ids = Array.from({ length: count }, (_, i) => ulidAt(now - (count - i) * 1000));
  const post = async (path, body) => {
    const answer = await fetch(new URL(path, base), { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });
    if (answer.status >= 300) throw new Error(`POST ${path}: ${answer.status} ${await answer.text()}`);
    return answer.json();
  };
  for (let i = 0; i < count; i += 16) {
    await Promise.all(ids.slice(i, i + 16).map(async (id, j) => {
      await post("/api/moments", { id, text: text(i + j) });
      if (reading) await post(`/api/moments/${id}/turns`, { client_request_id: `seed-${id}`, mode: "practical" });
    }));
  }
  return ids;
}
