// The page's service worker (served at /sw.js, scope /): the app shell
// offline, one build at a time, and nothing of the engine's API.
//
// - Install: downloads every file of the shell (the page, its script,
//   style sheet, icons and manifest, as web/build.mjs listed them in
//   __SPARK_SHELL__) into the cache `spark-page-<version>`, checking each
//   against its SHA-256 from the same build. A file that differs (the
//   engine already serves a newer build) fails the install and drops that
//   cache: a shell is never a mix of two builds. The browser fetches the
//   newer /sw.js and tries again with it.
// - Waiting: a new worker does not take over open pages by itself; the
//   page offers "Reload" and then sends `skip-waiting` (else it takes
//   over once every page of the old one is closed).
// - Activate: deletes every other `spark-page-*` cache.
// - Fetch: a GET of a shell path (a navigation to `/`, whatever its query)
//   answers from this worker's cache, so the page and its assets always
//   come from the worker's own build, online or not; everything else
//   (every /api/ request, /metrics, /healthz, media) is not touched and
//   goes to the network as if there were no worker. Nothing is ever
//   written to the cache but the shell at install: an answer of the
//   engine's API is never kept here (the page keeps its last-seen feed in
//   IndexedDB, and shows it as that, not as the truth).
export {};

/** Filled in by web/build.mjs: the shell's version and each path with its SHA-256 (hex). */
declare const __SPARK_SHELL__: { version: string; files: [string, string][] };

/** The parts of ServiceWorkerGlobalScope used here (the page's tsconfig has the DOM library, not WebWorker's). */
interface ExtendableEvent extends Event {
  waitUntil(promise: Promise<unknown>): void;
}
interface FetchEvent extends ExtendableEvent {
  readonly request: Request;
  respondWith(answer: Promise<Response>): void;
}
interface WorkerScope {
  readonly location: Location;
  skipWaiting(): Promise<void>;
  addEventListener(type: "install" | "activate", listener: (event: ExtendableEvent) => void): void;
  addEventListener(type: "fetch", listener: (event: FetchEvent) => void): void;
  addEventListener(type: "message", listener: (event: MessageEvent) => void): void;
}

const scope = self as unknown as WorkerScope;

/** The prefix of every cache this worker ever makes. */
const PREFIX = "spark-page-";
/** This build's cache. */
const CACHE = `${PREFIX}${__SPARK_SHELL__.version}`;
/** The shell's paths, each with its SHA-256. */
const SHELL = new Map(__SPARK_SHELL__.files);

function hex(digest: ArrayBuffer): string {
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** Downloads the shell into this build's cache, every file checked; on any failure the cache this install made is dropped and the install fails. */
async function precache(): Promise<void> {
  const existed = await caches.has(CACHE);
  const cache = await caches.open(CACHE);
  try {
    for (const [path, sha256] of SHELL) {
      // Revalidated (ETag), never a stale copy from the HTTP cache.
      const answer = await fetch(path, { cache: "no-cache", credentials: "same-origin", redirect: "error" });
      if (answer.status !== 200) throw new Error(`${path}: HTTP ${answer.status}`);
      const bytes = await answer.arrayBuffer();
      const got = hex(await crypto.subtle.digest("SHA-256", bytes));
      if (got !== sha256) throw new Error(`${path}: the engine serves another build of the page (SHA-256 ${got}, this worker's build has ${sha256})`);
      // The engine's headers (type, ETag, the page's Content-Security-Policy)
      // stay; the body is kept decoded.
      const headers = new Headers(answer.headers);
      headers.delete("content-encoding");
      headers.delete("content-length");
      await cache.put(path, new Response(bytes, { status: 200, statusText: "OK", headers }));
    }
  } catch (e) {
    // A cache an earlier worker of the same version filled stays.
    if (!existed) await caches.delete(CACHE);
    throw e;
  }
}

scope.addEventListener("install", (event) => event.waitUntil(precache()));

scope.addEventListener("activate", (event) => {
  event.waitUntil(
    (async () => {
      for (const name of await caches.keys()) {
        if (name.startsWith(PREFIX) && name !== CACHE) await caches.delete(name);
      }
    })(),
  );
});

scope.addEventListener("message", (event) => {
  if ((event.data as { type?: string } | null)?.type === "skip-waiting") void scope.skipWaiting();
});

scope.addEventListener("fetch", (event) => {
  const request = event.request;
  if (request.method !== "GET") return;
  const url = new URL(request.url);
  if (url.origin !== scope.location.origin) return;
  const path = request.mode === "navigate" && url.pathname === "/" ? "/" : url.search ? null : url.pathname;
  if (path === null || !SHELL.has(path)) return;
  event.respondWith(
    (async () => (await caches.match(path, { cacheName: CACHE })) ?? fetch(request))(),
  );
});
