// The committed generated types (src/generated/) match what
// openapi-typescript makes from the engine's OpenAPI document, the file
// the engine serves at GET /api/openapi.json (`npm run check:types`).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { generate, documentPath } from "../scripts/gen-types.mjs";

test("committed types match src/api/openapi.json", async () => {
  const generated = await generate(await readFile(documentPath, "utf8"));
  const api = await readFile(new URL("../src/generated/api.ts", import.meta.url), "utf8");
  const rules = await readFile(new URL("../src/generated/rules.ts", import.meta.url), "utf8");
  assert.ok(api === generated.api, "src/generated/api.ts is stale: run `npm run gen:types`");
  assert.ok(rules === generated.rules, "src/generated/rules.ts is stale: run `npm run gen:types`");
});

test("a changed document is caught", async () => {
  const doc = JSON.parse(await readFile(documentPath, "utf8"));
  doc.components.schemas.Message.properties.extra = { type: "string" };
  const generated = await generate(JSON.stringify(doc));
  const api = await readFile(new URL("../src/generated/api.ts", import.meta.url), "utf8");
  assert.notEqual(api, generated.api);
});
