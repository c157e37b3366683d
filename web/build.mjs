// Builds the engine's page into dist/ (committed; the binary embeds it
// with include_dir, so `cargo run` needs no Node):
//
//   dist/index.html, dist/assets/app.js, dist/assets/app.css, dist/assets/icon.svg
//   dist/assets/icon-192.png, icon-512.png, icon-maskable-512.png,
//     apple-touch-icon.png          rendered from icon.svg (resvg)
//   dist/app.webmanifest            the web app manifest (page/src/app.webmanifest)
//   dist/sw.js                      the service worker (page/src/sw.ts) with the
//                                   shell it serves offline: every file above
//                                   but itself, each with its SHA-256
//   dist/manifest.json   {"sources_sha256": ..., "shell_version": ..., "files": [...]}
//
// sources_sha256 is a SHA-256 over the page's and the client's sources
// (sourceFiles() below); tests/http/web.rs recomputes it in Rust and fails
// when the committed build is stale, with no Node needed. shell_version
// names the service worker's cache (`spark-page-<shell_version>`).
//
// The build fails when what a first visit downloads (the shell and the
// worker) weighs more than PAGE_GZIP_BYTES_MAX gzipped.
//
//   node build.mjs           build
//   node build.mjs --check   fail when dist/ differs from a fresh build
import { build } from "esbuild";
import { Resvg } from "@resvg/resvg-js";
import { createHash } from "node:crypto";
import { gzipSync } from "node:zlib";
import { mkdir, readFile, readdir, writeFile, copyFile, rm, mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const web = path.dirname(fileURLToPath(import.meta.url));

async function walk(dir) {
  const out = [];
  for (const item of await readdir(path.join(web, dir), { withFileTypes: true })) {
    const rel = `${dir}/${item.name}`;
    if (item.isDirectory()) out.push(...(await walk(rel)));
    else out.push(rel);
  }
  return out;
}

/** The files the build reads, relative to web/, sorted (byte order). */
export async function sourceFiles() {
  const files = [...(await walk("page")), ...(await walk("client/src")), "client/package-lock.json", "build.mjs"];
  return files.sort((a, b) => (Buffer.from(a) < Buffer.from(b) ? -1 : Buffer.from(a) > Buffer.from(b) ? 1 : 0));
}

/** SHA-256 over every source: for each, `<path>\n<length>\n<bytes>`. */
export async function sourcesSha256() {
  const hash = createHash("sha256");
  for (const file of await sourceFiles()) {
    const bytes = await readFile(path.join(web, file));
    hash.update(`${file}\n${bytes.length}\n`);
    hash.update(bytes);
  }
  return hash.digest("hex");
}

/** What a first visit downloads (the shell and the worker), gzipped, at most: 100 kB. */
export const PAGE_GZIP_BYTES_MAX = 100_000;

/** The PNG icons rendered from icon.svg: file name, size in px, and whether it is full-bleed (maskable: the icon in the inner 80 %, on its own colour). */
const ICONS = [
  ["icon-192.png", 192, false],
  ["icon-512.png", 512, false],
  ["icon-maskable-512.png", 512, true],
  // iOS fills a transparent touch icon with black: full-bleed too.
  ["apple-touch-icon.png", 180, true],
];

/**
 * The full-bleed variant of `svg`: its first fill colour as the
 * background, the drawing scaled into the safe zone of a maskable icon
 * (the centre circle of 80 % of the size).
 */
function fullBleed(svg) {
  const open = /^<svg[^>]*viewBox="0 0 (\d+) (\d+)"[^>]*>/.exec(svg);
  const fill = /fill="(#[0-9a-fA-F]{3,8})"/.exec(svg);
  if (!open || !fill || !svg.trimEnd().endsWith("</svg>")) throw new Error("icon.svg: expected <svg viewBox=\"0 0 W H\"> with a fill colour");
  const [w, h] = [Number(open[1]), Number(open[2])];
  const inner = svg.trimEnd().slice(open[0].length, -"</svg>".length);
  return `${open[0]}<rect width="${w}" height="${h}" fill="${fill[1]}"/><g transform="translate(${w * 0.1} ${h * 0.1}) scale(0.8)">${inner}</g></svg>`;
}

function sha256(bytes) {
  return createHash("sha256").update(bytes).digest("hex");
}

/** The URL path a dist/ file is served at: index.html is `/`. */
function urlPath(file) {
  return file === "index.html" ? "/" : `/${file}`;
}

async function buildInto(out) {
  await rm(out, { recursive: true, force: true });
  await mkdir(path.join(out, "assets"), { recursive: true });
  await build({
    entryPoints: [path.join(web, "page/src/main.ts")],
    bundle: true,
    format: "esm",
    platform: "browser",
    target: ["es2022", "chrome110", "safari16", "firefox115"],
    minify: true,
    legalComments: "none",
    outfile: path.join(out, "assets/app.js"),
    logLevel: "warning",
  });
  await copyFile(path.join(web, "page/src/app.css"), path.join(out, "assets/app.css"));
  await copyFile(path.join(web, "page/src/icon.svg"), path.join(out, "assets/icon.svg"));
  const svg = await readFile(path.join(web, "page/src/icon.svg"), "utf8");
  for (const [name, px, bleed] of ICONS) {
    const png = new Resvg(bleed ? fullBleed(svg) : svg, { fitTo: { mode: "width", value: px } }).render().asPng();
    await writeFile(path.join(out, "assets", name), png);
  }
  await copyFile(path.join(web, "page/src/app.webmanifest"), path.join(out, "app.webmanifest"));
  await copyFile(path.join(web, "page/index.html"), path.join(out, "index.html"));
  const shellFiles = ["index.html", "app.webmanifest", ...(await readdir(path.join(out, "assets"))).map((f) => `assets/${f}`)].sort();
  // The worker's shell: every file it serves, with its SHA-256 (the
  // worker checks each download against it, so a shell is never a mix of
  // two builds), and a version over those and the worker's own source.
  const shell = [];
  for (const file of shellFiles) shell.push([urlPath(file), sha256(await readFile(path.join(out, file)))]);
  if (shell.some(([url]) => url.startsWith("/api/"))) throw new Error("the shell must hold no /api/ path");
  const version = sha256(JSON.stringify(shell) + (await readFile(path.join(web, "page/src/sw.ts"), "utf8"))).slice(0, 16);
  await build({
    entryPoints: [path.join(web, "page/src/sw.ts")],
    bundle: true,
    format: "iife",
    platform: "browser",
    target: ["es2022", "chrome110", "safari16", "firefox115"],
    minify: true,
    legalComments: "none",
    define: { __SPARK_SHELL__: JSON.stringify({ version, files: shell }) },
    outfile: path.join(out, "sw.js"),
    logLevel: "warning",
  });
  const files = [...shellFiles, "sw.js"].sort();
  let gzipBytes = 0;
  for (const file of files) gzipBytes += gzipSync(await readFile(path.join(out, file)), { level: 9 }).length;
  if (gzipBytes > PAGE_GZIP_BYTES_MAX) {
    throw new Error(`the page weighs ${gzipBytes} bytes gzipped, over ${PAGE_GZIP_BYTES_MAX} (what a first visit downloads: ${files.join(", ")})`);
  }
  const manifest = { sources_sha256: await sourcesSha256(), shell_version: version, files };
  await writeFile(path.join(out, "manifest.json"), JSON.stringify(manifest, null, 2) + "\n");
  return { files: files.concat("manifest.json"), gzipBytes };
}

const check = process.argv.includes("--check");
if (!check) {
  const { files, gzipBytes } = await buildInto(path.join(web, "dist"));
  console.log(`built dist/: ${files.join(", ")}; ${gzipBytes} bytes gzipped (at most ${PAGE_GZIP_BYTES_MAX})`);
} else {
  const fresh = await mkdtemp(path.join(tmpdir(), "spark-web-"));
  const { files } = await buildInto(fresh);
  const stale = [];
  for (const f of files) {
    const a = await readFile(path.join(fresh, f)).catch(() => null);
    const b = await readFile(path.join(web, "dist", f)).catch(() => null);
    if (!a || !b || !a.equals(b)) stale.push(f);
  }
  await rm(fresh, { recursive: true, force: true });
  if (stale.length) {
    console.error(`dist/ is stale (${stale.join(", ")}): run \`npm run build\` in web/`);
    process.exit(1);
  }
  console.log("dist/ matches a fresh build");
}
