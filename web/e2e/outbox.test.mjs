// The outbox in a real browser against the real engine: a proxy that
// loses half the answers, offline captures, two tabs, and a browser
// closed with a full outbox and opened again.
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { api, browserOrSkip, capture, countKinds, launch, lossyProxy, openPage, opKinds, outDir, photoPng, startEngine, until } from "./harness.mjs";

const skip = browserOrSkip();

async function moments(base) {
  return (await api(base, "/api/moments?limit=1000")).moments;
}

async function thread(base, id) {
  return (await api(base, `/api/messages?thread=${id}`)).messages;
}

/** Sends a message from the open moment view. */
async function send(page, body) {
  await page.fill("#message-body", body);
  await page.click("#message-form button");
}

test("a proxy that drops half the answers: exactly one moment per capture, one message per send", { skip, timeout: 180_000 }, async () => {
  const engine = await startEngine();
  const proxy = await lossyProxy(engine.base);
  const { context } = await launch();
  try {
    const page = await openPage(context, proxy.base);
    await capture(page, photoPng(640, 480, 11), "Einfahrt");
    await capture(page, photoPng(640, 480, 12), "Ausfahrt");
    await until(async () => (await page.locator("#feed [data-outbox]").count()) === 0 && (await page.locator("#feed [data-moment-id]").count()) === 2, "both captures sent", 90_000);
    const [first] = await moments(engine.base);
    await page.locator(`#feed [data-moment-id="${first.id}"]`).click();
    for (const body of ["eins", "zwei", "drei"]) await send(page, body);
    await until(async () => (await page.locator('#thread [data-state="sent"]').count()) === 3, "three messages sent", 90_000);
    await until(async () => countKinds(await opKinds(engine.base))["media.put"] === 4, "every original", 90_000);
    const counts = countKinds(await opKinds(engine.base));
    assert.equal(counts["moment.create"], 2, "one moment per capture");
    assert.equal(counts["media.put"], 4);
    assert.equal(counts["turn.start"], 2, "one turn per capture");
    assert.equal(counts["message.post"], 3, "one message per send");
    assert.deepEqual((await thread(engine.base, first.id)).map((m) => m.body), ["eins", "zwei", "drei"], "in their order");
    assert.ok(proxy.stats.dropped >= 5, `answers were dropped (${proxy.stats.dropped})`);
  } finally {
    await context.close();
    await proxy.close();
    await engine.stop();
  }
});

test("offline, three captures wait; back online all are sent, in order", { skip, timeout: 120_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  try {
    const page = await openPage(context, engine.base);
    await context.setOffline(true);
    for (const [i, text] of ["erste", "zweite", "dritte"].entries()) await capture(page, photoPng(640, 480, 20 + i), text);
    await until(async () => (await page.locator('#feed [data-outbox="pending"]').count()) === 3, "three pending rows");
    await page.screenshot({ path: path.join(outDir, "offline.png") });
    assert.equal((await moments(engine.base)).length, 0, "nothing reached the engine");
    await context.setOffline(false);
    await until(async () => (await page.locator("#feed [data-outbox]").count()) === 0 && (await page.locator("#feed [data-moment-id]").count()) === 3, "all three sent", 60_000);
    const notices = await opKinds(engine.base);
    const created = notices.filter((n) => n.kind === "moment.create").map((n) => n.upserted[0]);
    const texts = await Promise.all(created.map(async (id) => (await api(engine.base, `/api/moments/${id}`)).text));
    assert.deepEqual(texts, ["erste", "zweite", "dritte"], "created in capture order");
    assert.equal(countKinds(notices)["moment.create"], 3);
  } finally {
    await context.close();
    await engine.stop();
  }
});

test("two tabs: one sends and holds the only event stream; close it and the other takes over, no duplicate", { skip, timeout: 120_000 }, async () => {
  const engine = await startEngine();
  const { context } = await launch();
  const streams = new Map();
  context.on("request", (r) => {
    if (r.url().includes("/api/events")) streams.set(r.frame().page(), (streams.get(r.frame().page()) ?? 0) + 1);
  });
  try {
    const first = await openPage(context, engine.base);
    await first.waitForSelector('#status[data-sender="true"]');
    const second = await openPage(context, engine.base);
    await second.waitForSelector('#status[data-sender="false"]');
    // The second tab captures; the first sends it; the second hears of it.
    await capture(second, photoPng(640, 480, 31), "aus dem zweiten Tab");
    await until(async () => (await second.locator('#feed [data-moment-id][data-reading="done"]').count()) === 1, "the second tab shows the sent moment and its reading");
    assert.equal(streams.get(second) ?? 0, 0, "the second tab opened no event stream");
    assert.ok((streams.get(first) ?? 0) >= 1, "the first tab holds the stream");
    // A capture waiting in the outbox while the sender closes.
    await context.setOffline(true);
    await capture(second, photoPng(640, 480, 32), "beim Wechsel");
    await first.close();
    await second.waitForSelector('#status[data-sender="true"]');
    await context.setOffline(false);
    await until(async () => (await second.locator("#feed [data-outbox]").count()) === 0 && (await second.locator("#feed [data-moment-id]").count()) === 2, "the new sender sent it", 60_000);
    assert.ok((streams.get(second) ?? 0) >= 1, "the new sender opened the stream");
    await capture(second, photoPng(640, 480, 33), "danach");
    await until(async () => (await second.locator("#feed [data-moment-id]").count()) === 3, "the third moment");
    await until(async () => countKinds(await opKinds(engine.base))["media.put"] === 6, "every original", 60_000);
    const counts = countKinds(await opKinds(engine.base));
    assert.equal(counts["moment.create"], 3, "no duplicate");
    assert.equal(counts["turn.start"], 3);
  } finally {
    await context.close();
    await engine.stop();
  }
});

test("the browser closed with a full outbox and opened again: everything is still sent", { skip, timeout: 120_000 }, async () => {
  const engine = await startEngine();
  let { context, userDataDir } = await launch();
  try {
    const page = await openPage(context, engine.base);
    await context.setOffline(true);
    await capture(page, photoPng(640, 480, 41), "vor dem Schließen");
    await capture(page, photoPng(640, 480, 42), "auch noch");
    await until(async () => (await page.locator('#feed [data-outbox="pending"]').count()) === 2, "two pending rows");
    await context.close();
    assert.equal((await moments(engine.base)).length, 0);
    ({ context } = await launch(userDataDir));
    const again = await openPage(context, engine.base);
    await until(async () => (await again.locator("#feed [data-outbox]").count()) === 0 && (await again.locator("#feed [data-moment-id]").count()) === 2, "both sent after the reopen", 60_000);
    await until(async () => countKinds(await opKinds(engine.base))["media.put"] === 4, "every original", 60_000);
    const counts = countKinds(await opKinds(engine.base));
    assert.equal(counts["moment.create"], 2);
    assert.equal(counts["turn.start"], 2);
  } finally {
    await context.close();
    await engine.stop();
  }
});
