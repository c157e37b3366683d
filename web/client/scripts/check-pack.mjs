// Checks the package as a user gets it: `npm pack` (its prepack builds
// dist/: the bundled ESM and the .d.ts files), the tarball installed into a
// scratch project, imported in Node, and a TypeScript consumer type-checked
// under `strict` and `exactOptionalPropertyTypes` without skipLibCheck.
//
//   node scripts/check-pack.mjs      (npm run check:pack)
import { execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const client = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const work = mkdtempSync(path.join(tmpdir(), "spark-client-pack-"));
const run = (cmd, args, cwd) => execFileSync(cmd, args, { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] });
try {
  const [packed] = JSON.parse(run("npm", ["pack", "--json", "--pack-destination", work], client).replace(/^[^[]*/s, ""));
  const files = packed.files.map((f) => f.path);
  for (const needed of ["dist/index.js", "dist/index.d.ts", "dist/client.d.ts", "dist/generated/api.d.ts", "README.md", "package.json"]) {
    if (!files.includes(needed)) throw new Error(`the tarball lacks ${needed} (it has ${files.join(", ")})`);
  }
  if (files.some((f) => f.startsWith("src/") || f.startsWith("test/"))) throw new Error(`the tarball ships sources or tests: ${files.join(", ")}`);
  const scratch = path.join(work, "scratch");
  mkdirSync(scratch);
  writeFileSync(path.join(scratch, "package.json"), JSON.stringify({ name: "scratch", private: true, type: "module" }));
  run("npm", ["install", "--no-audit", "--no-fund", "--prefer-offline", path.join(work, packed.filename)], scratch);
  writeFileSync(
    path.join(scratch, "use.mjs"),
    `import { SparkClient, mintUlid, systemClock, fitWithin, REUSE_MARGIN_MS, MAX_PHOTOS } from "@spark/client";
if (typeof SparkClient.open !== "function") throw new Error("no SparkClient.open");
if (MAX_PHOTOS !== 10) throw new Error("MAX_PHOTOS");
if (mintUlid(systemClock).length !== 26) throw new Error("mintUlid");
if (fitWithin(2048, 1536).width !== 1024) throw new Error("fitWithin");
if (REUSE_MARGIN_MS !== 240000) throw new Error("REUSE_MARGIN_MS");
console.log("imported @spark/client");
`,
  );
  process.stdout.write(run("node", ["use.mjs"], scratch));
  writeFileSync(
    path.join(scratch, "use.ts"),
    `import { SparkClient, MAX_PHOTOS, type CaptureInput, type Entry, type MessageRecord, type ChangeNotice, type components } from "@spark/client";
type Moment = components["schemas"]["Moment"];
export async function example(photo: Blob, show: (m: Moment | string) => void): Promise<MessageRecord> {
  const client = await SparkClient.open();
  client.addEventListener("change", (e) => show((e as CustomEvent<ChangeNotice>).detail.kind));
  const input: CaptureInput = { photo, text: "Ausfahrt freihalten" };
  const entry: Entry = await client.capture(input);
  const several: CaptureInput = { photos: [{ photo }, { photo, copy: photo }], text: null };
  const more: Entry = await client.capture(several);
  if (more.photos.length > MAX_PHOTOS) show(String(more.photos[0]?.photo));
  return client.sendMessage(entry.moment_id, "what does it mean?");
}
`,
  );
  writeFileSync(
    path.join(scratch, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: { target: "ES2022", module: "ESNext", moduleResolution: "Bundler", lib: ["ES2022", "DOM", "DOM.Iterable"], strict: true, exactOptionalPropertyTypes: true, noEmit: true, skipLibCheck: false, types: [] },
      include: ["use.ts"],
    }),
  );
  process.stdout.write(run(path.join(client, "node_modules/.bin/tsc"), ["-p", scratch], scratch));
  console.log(`packed ${packed.filename} (${files.length} files, ${packed.size} bytes): installs, imports and type-checks`);
} finally {
  rmSync(work, { recursive: true, force: true });
}
