import "fake-indexeddb/auto";
import { IDBFactory } from "fake-indexeddb";
import { after } from "node:test";
import { SparkClient, ManualClock } from "../dist/index.js";
import { FakeEngine } from "./fake-engine.mjs";

export const T0 = Date.UTC(2026, 11, 1, 12, 0, 0);
let n = 0;
const open = [];
// A failed assertion skips a test's close(); an open BroadcastChannel
// would keep the test process alive.
after(() => open.forEach((c) => c.close()));

/**
 * A client on a fresh fake IndexedDB with a manual page clock `offsetMs`
 * from the fake engine's clock, sending only when the test drains.
 */
export async function setup({ offsetMs = 0, factory = new IDBFactory(), engine, options = {} } = {}) {
  const serverClock = engine?.clockRef ?? new ManualClock(T0);
  engine ??= new FakeEngine(() => serverClock.now());
  engine.clockRef = serverClock;
  const pageClock = new ManualClock(serverClock.now() + offsetMs);
  const client = await SparkClient.open({
    fetch: engine.fetch,
    clock: pageClock,
    indexedDB: factory,
    dbName: "spark-test",
    tabs: false,
    events: false,
    autoSend: false,
    channelName: `test-${++n}`,
    makeCopy: async (photo) => new Blob([new Uint8Array(await photo.arrayBuffer()).slice(0, 4)], { type: "image/jpeg" }),
    ...options,
  });
  open.push(client);
  const advance = (ms) => {
    serverClock.advance(ms);
    pageClock.advance(ms);
  };
  return { client, engine, pageClock, serverClock, factory, advance };
}

export const photo = (text = "a sign") => new Blob([new TextEncoder().encode(`PHOTO ${text} ${"x".repeat(64)}`)], { type: "image/png" });

/** A scripted answer: the status with a problem body. */
export const answer = (status, code = `http_${status}`, headers = {}) => () =>
  new Response(JSON.stringify({ status, code, detail: `scripted ${status}`, title: code }), { status, headers: { "content-type": "application/problem+json", ...headers } });
