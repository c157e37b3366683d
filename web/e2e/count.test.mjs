// The feed's "N moments shown" follows the feed: live creates and deletes
// (made elsewhere, told by the event stream) change it without a reload
// (a newcomer saw "1 moment shown" stay while rows came and went).
import { test } from "node:test";
import { browserOrSkip, launch, openPage, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

async function create(base, text) {
  const made = await fetch(`${base}/api/moments`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ text }) });
  return (await made.json()).moment.id;
}

test("the feed's count follows live creates and deletes", { skip, timeout: 60_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    await create(engine.base, "eins");
    const page = await openPage(context, engine.base);
    const count = async (text) => until(async () => (await page.textContent("#feed-count")) === text, `"${text}"`);
    await count("1 moment shown");
    const second = await create(engine.base, "zwei");
    await until(async () => (await page.locator("#feed [data-moment-id]").count()) === 2, "the live row");
    await count("2 moments shown");
    await fetch(`${engine.base}/api/moments/${second}`, { method: "DELETE" });
    await until(async () => (await page.locator("#feed [data-moment-id]").count()) === 1, "the row gone");
    await count("1 moment shown");
  } finally {
    await context.close();
    await engine.stop();
  }
});
