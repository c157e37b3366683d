// The page's first load over a big feed, two builds side by side: time to
// the first feed row painted, to the page's ready mark, and the requests
// and bytes of the load, in headless Chromium against each build's own
// binary over the same data (a copy per run). Not a test: a measurement,
// run by hand (docs/performance/web-paging.md has its figures).
//
//   node perf/paging.mjs --before /tmp/main/spark-engine --after ../target/release/spark-engine \
//     [--moments 10000] [--rounds 3] [--data /tmp/spark-paging-seed]
//
// --data keeps the seeded data directory for the next run (seeding 10,000
// moments, each with a copy and a reading, takes a few minutes). The
// machine is shared: compare the two builds' ratios, measured in one run,
// alternating, not the absolute times.
import { cpSync, existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { NO_OCR, launch, photoPng, seedMoments, startEngine, ulidAt } from "../e2e/harness.mjs";

const { values: opts } = parseArgs({
  options: {
    before: { type: "string" },
    after: { type: "string" },
    moments: { type: "string", default: "10000" },
    rounds: { type: "string", default: "3" },
    data: { type: "string" },
  },
});
if (!opts.before || !opts.after) {
  console.error("usage: node perf/paging.mjs --before BIN --after BIN [--moments N] [--rounds N] [--data DIR]");
  process.exit(2);
}
const count = Number(opts.moments);
const rounds = Number(opts.rounds);
const seedDir = opts.data ?? mkdtempSync(path.join(tmpdir(), "spark-paging-seed-"));
const config = NO_OCR;
const configFile = path.join(mkdtempSync(path.join(tmpdir(), "spark-paging-cfg-")), "spark.toml");
writeFileSync(configFile, config);

/** Seeds `count` moments, each with a small copy and its reading (the offline brain, from the text). */
async function seed() {
  const marker = path.join(seedDir, `seeded-${count}`);
  if (existsSync(marker)) return;
  const engine = await startEngine({ config, bin: opts.after, data: path.join(seedDir, "data"), checkPage: false });
  try {
    const started = Date.now();
    const ids = await seedMoments(engine.base, count, { reading: false });
    const copy = photoPng(160, 120, 7);
    for (let i = 0; i < ids.length; i += 16) {
      await Promise.all(ids.slice(i, i + 16).map(async (id) => {
        const put = await fetch(`${engine.base}/api/media/${ulidAt(Date.now())}`, { method: "PUT", headers: { "x-moment-id": id, "x-media-role": "copy", "content-type": "image/png" }, body: copy });
        if (put.status >= 300) throw new Error(`PUT copy: ${put.status} ${await put.text()}`);
        const turn = await fetch(`${engine.base}/api/moments/${id}/turns`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ client_request_id: `seed-${id}`, mode: "practical" }) });
        if (turn.status >= 300) throw new Error(`POST turn: ${turn.status} ${await turn.text()}`);
      }));
      if (i % 1000 === 0) process.stderr.write(`seeded ${i}/${count}\r`);
    }
    // Every reading finished before the measurement.
    for (;;) {
      const head = await (await fetch(`${engine.base}/api/log/head`)).json();
      if (head.seq >= 4 * count) break;
      await new Promise((r) => setTimeout(r, 500));
    }
    console.error(`seeded ${count} moments in ${((Date.now() - started) / 1000).toFixed(0)} s`);
  } finally {
    await engine.stop();
  }
  writeFileSync(marker, "");
}

/** Marks, in the page: the first feed row painted, and the ready mark. */
const MARKS = `(() => {
  const seen = () => document.querySelector("#feed [data-moment-id]");
  new MutationObserver((_, observer) => {
    if (!globalThis.__feedPaint && seen()) {
      globalThis.__feedPaint = -1;
      requestAnimationFrame(() => setTimeout(() => (globalThis.__feedPaint = performance.now()), 0));
    }
    if (!globalThis.__ready && document.body?.dataset.ready === "true") globalThis.__ready = performance.now();
    if (globalThis.__feedPaint > 0 && globalThis.__ready) observer.disconnect();
  }).observe(document, { subtree: true, childList: true, attributes: true, attributeFilter: ["data-ready"] });
})();`;

/** One load of the page by `bin` over a copy of the seeded data. */
async function measure(bin) {
  const data = mkdtempSync(path.join(tmpdir(), "spark-paging-run-"));
  cpSync(path.join(seedDir, "data"), path.join(data, "data"), { recursive: true });
  const engine = await startEngine({ config, bin, data: path.join(data, "data"), checkPage: false });
  const { context, userDataDir } = await launch();
  try {
    await context.addInitScript(MARKS);
    const page = await context.newPage();
    const cdp = await context.newCDPSession(page);
    await cdp.send("Network.enable");
    let requests = 0;
    let bytes = 0;
    let lastRequestAt = Date.now();
    cdp.on("Network.requestWillBeSent", () => {
      requests += 1;
      lastRequestAt = Date.now();
    });
    // Every response that finished (the event stream, open for good, is counted as a request only).
    cdp.on("Network.loadingFinished", (e) => (bytes += e.encodedDataLength));
    await page.goto(engine.base);
    await page.waitForFunction(() => globalThis.__feedPaint > 0 && globalThis.__ready > 0, null, { timeout: 600_000, polling: 100 });
    // The load is over once no request started for 2 s.
    while (Date.now() - lastRequestAt < 2000) await new Promise((r) => setTimeout(r, 250));
    const marks = await page.evaluate(() => ({
      feedPaintMs: globalThis.__feedPaint,
      readyMs: globalThis.__ready,
      fcpMs: performance.getEntriesByName("first-contentful-paint")[0]?.startTime ?? null,
      rows: document.querySelectorAll("#feed [data-moment-id]").length,
      heapBytes: performance.memory?.usedJSHeapSize ?? null,
    }));
    return { ...marks, requests, bytes };
  } finally {
    await context.close();
    await engine.stop();
    rmSync(data, { recursive: true, force: true });
    rmSync(userDataDir, { recursive: true, force: true });
  }
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

await seed();
const runs = { before: [], after: [] };
for (let round = 1; round <= rounds; round += 1) {
  // Alternate which goes first, so that neither always meets a warmer machine.
  const order = round % 2 ? ["before", "after"] : ["after", "before"];
  for (const which of order) {
    const run = await measure(opts[which]);
    runs[which].push(run);
    console.error(`round ${round} ${which}: ${JSON.stringify(run)}`);
  }
}
const metrics = [
  ["first feed row painted (ms)", "feedPaintMs"],
  ["ready mark (ms)", "readyMs"],
  ["first contentful paint (ms)", "fcpMs"],
  ["requests on load", "requests"],
  ["bytes on load (transferred)", "bytes"],
  ["feed rows in the DOM", "rows"],
  ["JS heap after load (bytes)", "heapBytes"],
];
const lines = [`${count} moments, ${rounds} rounds, medians (Chromium headless, 412x860)`, "", "| | before | after | after / before |", "| --- | ---: | ---: | ---: |"];
for (const [label, key] of metrics) {
  const b = median(runs.before.map((r) => r[key] ?? 0));
  const a = median(runs.after.map((r) => r[key] ?? 0));
  lines.push(`| ${label} | ${Math.round(b)} | ${Math.round(a)} | ${b ? (a / b).toFixed(3) : "-"} |`);
}
console.log(lines.join("\n"));
if (!opts.data) rmSync(seedDir, { recursive: true, force: true });
