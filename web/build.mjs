// Builds the engine's page into dist/ (committed; the binary embeds it
// with include_dir, so `cargo run` needs no Node):
//
//   dist/index.html, dist/assets/app.js, dist/assets/app.css, dist/assets/icon.svg
//   dist/manifest.json   {"sources_sha256": ..., "files": [...]}
//
// sources_sha256 is a SHA-256 over the page's and the client's sources
// (sourceFiles() below); tests/http/web.rs recomputes it in Rust and fails
// when the committed build is stale, with no Node needed.
//
//   node build.mjs           build
//   node build.mjs --check   fail when dist/ differs from a fresh build
import { build } from "esbuild";
import { createHash } from "node:crypto";
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
  await copyFile(path.join(web, "page/index.html"), path.join(out, "index.html"));
  const files = ["index.html", ...(await readdir(path.join(out, "assets"))).map((f) => `assets/${f}`)].sort();
  const manifest = { sources_sha256: await sourcesSha256(), files };
  await writeFile(path.join(out, "manifest.json"), JSON.stringify(manifest, null, 2) + "\n");
  return files.concat("manifest.json");
}

const check = process.argv.includes("--check");
if (!check) {
  const files = await buildInto(path.join(web, "dist"));
  console.log(`built dist/: ${files.join(", ")}`);
} else {
  const fresh = await mkdtemp(path.join(tmpdir(), "spark-web-"));
  const files = await buildInto(fresh);
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
