// WCAG AA for text, light and dark: every visible text on the page (the
// feed with moments, waiting, parked and failed rows, the undo bar, the
// preview strip of several photos, an error, a notice, a moment whose reading failed with "Read again" and
// its refusal) reaches 4.5:1 against what is behind it (3:1 for large
// text), backgrounds with alpha blended over their parents.
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { NO_OCR, browserOrSkip, capture, launch, noisePng, openMoment, openPage, outDir, photoPng, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

/** Every visible element with text of its own whose contrast is under AA: [{ text, fg, bg, ratio, need }]. */
function audit(page) {
  return page.evaluate(() => {
    const parse = (css) => {
      let m = /^rgba?\(([^)]+)\)$/.exec(css);
      if (m) {
        const [r, g, b, a = 1] = m[1].split(/[\s,/]+/).filter(Boolean).map(Number);
        return [r, g, b, a];
      }
      m = /^color\(srgb ([^)]+)\)$/.exec(css);
      if (m) {
        const [r, g, b, a = 1] = m[1].split(/[\s/]+/).filter(Boolean).map(Number);
        return [r * 255, g * 255, b * 255, a];
      }
      throw new Error(`unparsed colour ${css}`);
    };
    const over = (top, under) => {
      const a = top[3];
      return [0, 1, 2].map((i) => top[i] * a + under[i] * (1 - a)).concat(1);
    };
    const background = (el) => {
      const layers = [];
      for (let n = el; n; n = n.parentElement) layers.push(parse(getComputedStyle(n).backgroundColor));
      let bg = [255, 255, 255, 1];
      const scheme = getComputedStyle(document.documentElement).colorScheme;
      if (matchMedia("(prefers-color-scheme: dark)").matches && scheme.includes("dark")) bg = [18, 18, 18, 1];
      for (const layer of layers.reverse()) bg = over(layer, bg);
      return bg;
    };
    const lum = ([r, g, b]) => {
      const f = (v) => ((v /= 255) <= 0.04045 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4);
      return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
    };
    const ratio = (a, b) => {
      const [hi, lo] = [lum(a), lum(b)].sort((x, y) => y - x);
      return (hi + 0.05) / (lo + 0.05);
    };
    const out = [];
    let checked = 0;
    for (const el of document.body.querySelectorAll("*")) {
      const own = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
      const field = (el.tagName === "INPUT" && el.type !== "file") || el.tagName === "TEXTAREA";
      if (!own && !field) continue;
      const style = getComputedStyle(el);
      const box = el.getBoundingClientRect();
      if (!el.checkVisibility({ checkVisibilityCSS: true }) || box.width === 0 || box.height === 0) continue;
      const bg = background(el);
      const size = parseFloat(style.fontSize);
      const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
      const need = large ? 3 : 4.5;
      const colours = [["text", style.color]];
      if (field && !el.value) colours.push(["placeholder", getComputedStyle(el, "::placeholder").color]);
      for (const [what, colour] of colours) {
        checked += 1;
        const fg = over(parse(colour), bg);
        const r = ratio(fg, bg);
        if (r < need) out.push({ text: `${what}: ${(el.textContent || el.placeholder || el.id).trim().slice(0, 60)}`, fg: colour, bg: `rgb(${bg.slice(0, 3).map(Math.round).join(",")})`, ratio: Number(r.toFixed(2)), need });
      }
    }
    return { failures: out, checked };
  });
}

test("every visible text has AA contrast, light and dark, in the feed's states and a moment whose reading failed", { skip, timeout: 180_000 }, async () => {
  // The copy fits in 2 MB; the noise original does not: a parked capture.
  const engine = await startEngine({ config: `[limits]\nmedia_limit_bytes = 2000000\n\n${NO_OCR}` });
  const { context } = await launch();
  try {
    const made = await fetch(`${engine.base}/api/moments`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ text: "Zur Uhr" }) });
    const clockMoment = (await made.json()).moment.id;
    const page = await openPage(context, engine.base);
    // A moment read, a parked capture, a failed reading (no text, OCR off).
    await capture(page, photoPng(320, 240, 121), "Ausfahrt freihalten");
    await capture(page, noisePng(2048, 1536), "zu groß");
    await page.setInputFiles("#capture-file", { name: "leer.png", mimeType: "image/png", buffer: photoPng(320, 240, 122) });
    await page.waitForSelector("#capture-preview img");
    await page.click("#capture-save");
    await page.locator('#feed [data-outbox="parked"]').waitFor({ timeout: 60_000 });
    await until(async () => (await page.locator('#feed [data-reading="failed"]').count()) === 1, "the failed reading");
    const failedId = await page.getAttribute('#feed [data-reading="failed"]', "data-moment-id");
    // A failed message: the page's clock 6 minutes behind while it is sent.
    await page.evaluate(() => {
      const RealDate = Date;
      const shift = -6 * 60_000;
      globalThis.Date = class extends RealDate {
        constructor(...a) { if (a.length === 0) super(RealDate.now() + shift); else super(...a); }
        static now() { return RealDate.now() + shift; }
      };
      globalThis.__restoreDate = () => (globalThis.Date = RealDate);
    });
    await openMoment(page, clockMoment);
    await page.fill("#message-body", "zu spät");
    await page.click("#message-form button");
    await page.waitForSelector('#thread [data-state="failed"]');
    await page.evaluate(() => globalThis.__restoreDate());
    await page.click("#back");
    await page.locator('#feed [data-outbox="failed"]').waitFor();
    // Offline: a waiting capture, the undo bar, the status; a refused file's error.
    await context.setOffline(true);
    await capture(page, photoPng(320, 240, 123), "wartet");
    await page.locator('#feed [data-outbox="pending"]').waitFor();
    // Two photos chosen (the numbered preview strip and its note), then a file that is no photo.
    await page.setInputFiles("#capture-pick", [
      { name: "eins.png", mimeType: "image/png", buffer: photoPng(320, 240, 124) },
      { name: "zwei.png", mimeType: "image/png", buffer: photoPng(320, 240, 125) },
    ]);
    await until(async () => (await page.locator("#capture-preview img").count()) === 2, "the strip");
    await page.setInputFiles("#capture-pick", { name: "notiz.txt", mimeType: "text/plain", buffer: Buffer.from("hallo") });
    await until(async () => (await page.textContent("#capture-error")).includes("notiz.txt"), "the refusal");
    await page.evaluate(() => window.scrollTo(0, 0));

    const failures = [];
    let checked = 0;
    for (const scheme of ["light", "dark"]) {
      await page.emulateMedia({ colorScheme: scheme });
      await page.screenshot({ path: path.join(outDir, `contrast-feed-${scheme}.png`), fullPage: true });
      const feed = await audit(page);
      checked += feed.checked;
      failures.push(...feed.failures.map((f) => ({ scheme, view: "feed", ...f })));
    }
    // A notice (the alert line): a waiting capture removed.
    page.on("dialog", (d) => void d.accept());
    await page.locator('#feed [data-outbox="pending"]').getByRole("button", { name: "Remove “wartet”" }).click();
    await page.waitForSelector("#notice:not([hidden])");
    // The moment whose reading failed, with "Read again" refused for want of a network.
    await context.setOffline(false);
    await openMoment(page, failedId);
    await page.waitForSelector("#moment-reading[data-status=failed]");
    await page.route("**/api/moments/*/turns", (route) => route.abort("connectionfailed"));
    await page.click("#read-again");
    await until(async () => /did not answer/.test(await page.textContent("#read-again-status")), "the refusal said");
    assert.ok(await page.locator("#notice").isVisible(), "the notice is still shown");
    for (const scheme of ["light", "dark"]) {
      await page.emulateMedia({ colorScheme: scheme });
      await page.screenshot({ path: path.join(outDir, `contrast-moment-${scheme}.png`), fullPage: true });
      const moment = await audit(page);
      checked += moment.checked;
      failures.push(...moment.failures.map((f) => ({ scheme, view: "moment", ...f })));
    }
    assert.ok(checked > 80, `texts checked: ${checked}`);
    assert.deepEqual(failures, [], JSON.stringify(failures, null, 1));
  } finally {
    await context.close();
    await engine.stop();
  }
});
