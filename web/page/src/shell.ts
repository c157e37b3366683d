// The page as an installable app: registers the service worker (/sw.js,
// scope /; web/page/src/sw.ts says what it serves) and offers a new build
// of the page once the engine ships one. A new worker waits while this
// page runs on the old one; the page then shows "A new version of the
// page is ready" with Reload, which lets the new worker take over, and
// every page of the old one reloads at once (so no page runs old code on
// the new build's cache). The engine's own data never goes through the
// worker's cache: captures wait in the outbox, the feed as last seen is
// in IndexedDB (offline.ts).

/** Registers the worker and watches for a new one; a browser without service workers runs the page as before. */
export function startAppShell(): void {
  if (!("serviceWorker" in navigator)) return;
  const sw = navigator.serviceWorker;
  // A page that started without a worker is not reloaded when the first
  // one activates: it has nothing old to drop.
  const hadController = sw.controller !== null;
  let reloading = false;
  sw.addEventListener("controllerchange", () => {
    if (!hadController || reloading) return;
    reloading = true;
    location.reload();
  });
  sw.register("/sw.js", { scope: "/", updateViaCache: "none" })
    .then((registration) => {
      document.body.dataset.shell = "registered";
      if (registration.waiting && sw.controller) offer(registration.waiting);
      registration.addEventListener("updatefound", () => {
        const worker = registration.installing;
        worker?.addEventListener("statechange", () => {
          if (worker.state === "installed" && sw.controller) offer(worker);
        });
      });
      // A page kept open for days (an installed app) still learns of a
      // new build: the browser checks on navigations, this on each return.
      document.addEventListener("visibilitychange", () => {
        if (document.visibilityState === "visible") void registration.update().catch(() => undefined);
      });
    })
    .catch((e: unknown) => {
      // Works as a plain page (no offline start); says why in the console.
      document.body.dataset.shell = "unavailable";
      console.warn("the page's service worker could not be registered:", e);
    });
}

/** Shows the offer of the waiting worker's build (once). */
function offer(worker: ServiceWorker): void {
  if (document.getElementById("update")) return;
  const bar = document.createElement("p");
  bar.id = "update";
  bar.className = "update";
  bar.setAttribute("role", "status");
  const button = document.createElement("button");
  button.type = "button";
  button.textContent = "Reload";
  button.onclick = () => {
    button.disabled = true;
    worker.postMessage({ type: "skip-waiting" });
  };
  bar.append("A new version of the page is ready. ", button);
  document.querySelector("header")?.after(bar);
  document.body.dataset.update = "ready";
}
