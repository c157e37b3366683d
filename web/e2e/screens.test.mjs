// Screenshots of the page's main screens (the feed, a capture of several
// photos before Save, a moment of two photos, the start without the engine) on a phone and a desktop, in the light and the dark
// colour scheme, against the real engine with photos of signs drawn here;
// and the text on each screen keeps a contrast of at least 4.5:1 (WCAG AA)
// in both schemes. The screenshots go to web/e2e/out/screens/, or, with
// SPARK_SCREENSHOTS=1, to docs/screens/ (committed; docs/web.md shows
// them), so a test run does not change the tree.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import path from "node:path";
import { browserOrSkip, capture, contrast, launch, openMoment, openPage, outDir, repo, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();
const screensDir = process.env.SPARK_SCREENSHOTS === "1" ? path.join(repo, "docs/screens") : path.join(outDir, "screens");

const DEVICES = {
  phone: { width: 412, height: 860 },
  desktop: { width: 1280, height: 800 },
};
const SCHEMES = ["light", "dark"];

/** The signs photographed: their lines, colours, and the text typed with them. */
const SIGNS = [
  { lines: ["AUSFAHRT", "FREIHALTEN"], bg: "#1d4ed8", fg: "#ffffff", wall: "#8a8f98", text: "Ausfahrt freihalten" },
  { lines: ["BITTE NICHT", "RAUCHEN"], bg: "#f4f4f0", fg: "#b91c1c", wall: "#a0805c", text: "Bitte nicht rauchen" },
  { lines: ["NOTAUSGANG"], bg: "#15803d", fg: "#ffffff", wall: "#c9c4b8", text: "Notausgang", more: [{ lines: ["NOTAUSGANG", "→"], bg: "#15803d", fg: "#ffffff", wall: "#7c6f5f" }] },
];

/** A photo of `sign` (PNG bytes), drawn in the page's canvas: a wall, a shadow, the sign with its border and bold lines. */
async function signPhoto(page, sign) {
  const base64 = await page.evaluate((s) => {
    const canvas = document.createElement("canvas");
    canvas.width = 1200;
    canvas.height = 900;
    const g = canvas.getContext("2d");
    const wall = g.createLinearGradient(0, 0, 1200, 900);
    wall.addColorStop(0, s.wall);
    wall.addColorStop(1, "#3a3a40");
    g.fillStyle = wall;
    g.fillRect(0, 0, 1200, 900);
    g.fillStyle = "rgba(0,0,0,.35)";
    g.fillRect(190, 230, 860, 480);
    g.fillStyle = s.bg;
    g.fillRect(170, 210, 860, 480);
    g.strokeStyle = s.fg;
    g.lineWidth = 14;
    g.strokeRect(195, 235, 810, 430);
    g.fillStyle = s.fg;
    g.font = "bold 104px DejaVu Sans, sans-serif";
    g.textAlign = "center";
    g.textBaseline = "middle";
    s.lines.forEach((line, i) => g.fillText(line, 600, 450 + (i - (s.lines.length - 1) / 2) * 130, 760));
    return canvas.toDataURL("image/png").split(",")[1];
  }, sign);
  return Buffer.from(base64, "base64");
}

/**
 * Each visible text element of the screen with its colour and the colour
 * behind it (backgrounds blended up the tree over the page's own), as
 * `rgb()` strings.
 */
async function textColours(page) {
  return page.evaluate(() => {
    const parse = (css) => {
      const m = css.match(/[\d.]+/g)?.map(Number) ?? [0, 0, 0, 0];
      return { r: m[0], g: m[1], b: m[2], a: m.length > 3 ? m[3] : 1 };
    };
    const over = (top, under) => ({ r: top.r * top.a + under.r * (1 - top.a), g: top.g * top.a + under.g * (1 - top.a), b: top.b * top.a + under.b * (1 - top.a), a: 1 });
    const behind = (node) => {
      const layers = [];
      for (let n = node; n; n = n.parentElement) layers.push(parse(getComputedStyle(n).backgroundColor));
      let colour = parse(getComputedStyle(document.documentElement).backgroundColor);
      if (colour.a === 0) colour = { r: 255, g: 255, b: 255, a: 1 };
      for (const layer of layers.reverse()) colour = over(layer, colour);
      return colour;
    };
    const rgb = (c) => `rgb(${Math.round(c.r)}, ${Math.round(c.g)}, ${Math.round(c.b)})`;
    const out = [];
    const all = document.querySelectorAll("h1, h2, h3, nav button, #status, .title, .snippet, .muted, .badge, .reading, .update, .last-seen, button, label, #thread li, dd, dt");
    for (const el of all) {
      const box = el.getBoundingClientRect();
      if (!box.width || !box.height || el.closest("[hidden]") || !el.textContent.trim()) continue;
      const style = getComputedStyle(el);
      if (style.visibility === "hidden" || style.display === "none") continue;
      const bg = behind(el);
      out.push({ what: `${el.tagName.toLowerCase()}${el.id ? `#${el.id}` : ""}${el.className ? `.${String(el.className).split(" ").join(".")}` : ""} “${el.textContent.trim().slice(0, 30)}”`, fg: rgb(over(parse(style.color), bg)), bg: rgb(bg) });
    }
    return out;
  });
}

/** Shoots `name` in every device and scheme, and checks the text's contrast on each. */
async function shoot(page, name, prepare = async () => {}) {
  for (const [device, size] of Object.entries(DEVICES)) {
    await page.setViewportSize(size);
    for (const scheme of SCHEMES) {
      await page.emulateMedia({ colorScheme: scheme });
      await prepare();
      await page.evaluate(() => window.scrollTo(0, 0));
      await page.waitForFunction(() => [...document.images].every((i) => i.complete));
      const texts = (await textColours(page)).map((t) => ({ ...t, ratio: contrast(t.fg, t.bg) }));
      assert.ok(texts.length >= 10, `${name}: only ${texts.length} texts measured`);
      const low = texts.filter((t) => t.ratio < 4.5);
      assert.deepEqual(low.map((t) => `${t.what}: ${t.fg} on ${t.bg} is ${t.ratio.toFixed(2)}:1`), [], `${name}, ${device}, ${scheme}: text under 4.5:1`);
      await page.screenshot({ path: path.join(screensDir, `${name}-${device}-${scheme}.png`), fullPage: true });
    }
  }
}

test("screenshots of the main screens, phone and desktop, light and dark, with readable contrast", { skip, timeout: 300_000 }, async () => {
  mkdirSync(screensDir, { recursive: true });
  let engine = await startEngine();
  const listen = new URL(engine.base).host;
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    for (const sign of SIGNS) {
      if (!sign.more) {
        await capture(page, await signPhoto(page, sign), sign.text, `${sign.text}.png`);
        continue;
      }
      // A moment of several photos (issue 27): the sign and a second view of it.
      const photos = [sign, ...sign.more];
      await page.setInputFiles("#capture-pick", await Promise.all(photos.map(async (p, i) => ({ name: `${sign.text} ${i + 1}.png`, mimeType: "image/png", buffer: await signPhoto(page, p) }))));
      await until(async () => (await page.locator("#capture-preview img").count()) === photos.length, "the previews");
      await page.fill("#capture-text", sign.text);
      await page.click("#capture-save");
      await page.waitForSelector("#capture-form[data-photos='0']", { state: "attached" });
    }
    await until(async () => (await page.locator('#feed [data-moment-id][data-reading="done"]').count()) === SIGNS.length, "every reading", 90_000);
    await page.waitForFunction(() => [...document.querySelectorAll("#feed img")].every((i) => i.complete && i.naturalWidth > 0));
    await shoot(page, "feed");

    // A capture of three photos before Save: the preview strip, each photo numbered and removable.
    const strip = [
      { lines: ["EINFAHRT"], bg: "#1d4ed8", fg: "#ffffff", wall: "#9ca3af" },
      { lines: ["EINFAHRT", "FREIHALTEN"], bg: "#1d4ed8", fg: "#ffffff", wall: "#78716c" },
      { lines: ["TAG UND", "NACHT"], bg: "#f4f4f0", fg: "#111111", wall: "#a8a29e" },
    ];
    await page.setInputFiles("#capture-pick", await Promise.all(strip.map(async (p, i) => ({ name: `einfahrt-${i + 1}.png`, mimeType: "image/png", buffer: await signPhoto(page, p) }))));
    await until(async () => (await page.locator("#capture-preview img").count()) === strip.length, "the strip");
    await page.fill("#capture-text", "Einfahrt freihalten, Tag und Nacht");
    await shoot(page, "capture");
    await page.click("#capture-clear");
    await page.fill("#capture-text", "");

    const first = await page.locator("#feed [data-moment-id]").first().getAttribute("data-moment-id");
    await openMoment(page, first);
    await page.fill("#keep-phrase", "Ausfahrt freihalten");
    await page.click("#keep-form button");
    await page.waitForSelector("#keep-status:has-text('Kept')");
    await page.fill("#message-body", "Was heißt „freihalten“?");
    await page.click("#message-form button");
    await page.waitForSelector('#thread [data-state="sent"]');
    await shoot(page, "moment");
    await page.click("#back");

    // Without the engine: the feed as last seen and a capture waiting.
    await until(async () => page.evaluate(() => new Promise((resolve) => {
      const open = indexedDB.open("spark-last-seen");
      open.onsuccess = () => {
        const tx = open.result.transaction("thumbs");
        const count = tx.objectStore("thumbs").count();
        tx.oncomplete = () => resolve(count.result === 3);
      };
      open.onerror = () => resolve(false);
    })), "the thumbnails kept");
    await engine.stop({ keepData: true });
    await capture(page, await signPhoto(page, { lines: ["PRIVAT"], bg: "#fbbf24", fg: "#111111", wall: "#6b7280" }), "Privat", "privat.png");
    // Stored (the outbox shows it) before the reload.
    await page.waitForSelector('#feed [data-outbox="pending"]');
    await page.reload();
    await page.waitForSelector("#last-seen");
    await page.waitForSelector('#feed [data-outbox="pending"]');
    await until(async () => (await page.locator('#feed img[data-last-seen="true"]').count()) === SIGNS.length, "the kept thumbnails");
    await shoot(page, "offline", async () => {
      await until(async () => /Can't reach the engine|Reconnecting|Offline/.test(await page.textContent("#status")), "the status saying so");
    });
    engine = await startEngine({ listen, dir: engine.dir });
  } finally {
    await context.close();
    await engine.stop();
  }
});
