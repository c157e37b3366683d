// Builds the client package into dist/index.js (ESM, for node --test and
// for bundlers that take built code).
import { build } from "esbuild";

await build({
  entryPoints: ["src/index.ts"],
  bundle: true,
  format: "esm",
  platform: "neutral",
  mainFields: ["browser", "module", "main"],
  conditions: ["browser"],
  target: "es2022",
  outfile: "dist/index.js",
  logLevel: "warning",
});
