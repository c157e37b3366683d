// The feed as last seen, for a start without the engine: before the engine
// answers, the page shows the moments (and their readings) it last loaded,
// with thumbnails of the copies the person saw, all from this device's
// IndexedDB (the client's LastSeen), and says so. Once the engine answered
// (`body[data-ready=true]`), every change of the feed's rows saves the
// feed again (a moment deleted elsewhere leaves the device at the next
// load; a sign-out empties it). An image of the engine's media that
// cannot load (offline) shows its kept thumbnail instead.
//
// Only the rows of moments are read (`[data-moment-id]` in `#feed`); the
// outbox's rows have their own store.
import { LastSeen, LAST_SEEN_THUMB_PX, fitWithin, type components } from "../../client/src/index.js";

type Moment = components["schemas"]["Moment"];
type Turn = components["schemas"]["Turn"];

/** What the page shows the feed with: its list, its empty note, the maps its rows are made from, and how a row is made. */
export interface FeedView {
  feed: HTMLElement;
  empty: HTMLElement;
  moments: Map<string, Moment>;
  turns: Map<string, Turn>;
  row: (m: Moment) => HTMLElement;
}

/** Quiet time before a change of the feed is saved, in ms (a load replaces every row at once). */
const SAVE_DELAY_MS = 500;
/** A thumbnail's JPEG quality (0..1). */
const THUMB_JPEG_QUALITY = 0.8;
/** The path of one media file of the engine: its id. */
const MEDIA_PATH = /^\/api\/media\/([0-9A-HJKMNP-TV-Z]{26})$/;

let opened: Promise<LastSeen | null> | null = null;

/** The store, opened once; null where IndexedDB fails (private modes): the page works without it. */
function store(): Promise<LastSeen | null> {
  opened ??= LastSeen.open().catch(() => null);
  return opened;
}

/** The media id of an image of the engine's media, or null. */
function mediaId(img: HTMLImageElement): string | null {
  if (!img.src) return null;
  const url = new URL(img.src, location.href);
  if (url.origin !== location.origin) return null;
  return MEDIA_PATH.exec(url.pathname)?.[1] ?? null;
}

/**
 * Shows the feed as last saved, when the feed shows no moment yet: fills
 * the maps, appends a row per moment, and puts a note above the feed
 * ("As last seen …") until the engine answers. Returns how many moments.
 */
export async function restoreLastSeen(view: FeedView): Promise<number> {
  const db = await store();
  const snapshot = await db?.read().catch(() => undefined);
  if (!snapshot || !snapshot.moments.length || view.feed.querySelector("[data-moment-id]")) return 0;
  for (const t of snapshot.turns) view.turns.set(t.id, t);
  for (const m of snapshot.moments) {
    view.moments.set(m.id, m);
    view.feed.append(view.row(m));
  }
  view.empty.hidden = true;
  document.body.dataset.feed = "last-seen";
  const note = document.createElement("p");
  note.id = "last-seen";
  note.className = "muted last-seen";
  note.setAttribute("role", "note");
  note.textContent = `As last seen ${new Date(snapshot.saved_at_ms).toLocaleString()}; new moments show once the engine answers.`;
  view.feed.before(note);
  return snapshot.moments.length;
}

/** The moments the feed's rows show, in their order, and the turns they name. */
function shown(view: FeedView): { moments: Moment[]; turns: Turn[] } {
  const moments = [...view.feed.querySelectorAll<HTMLElement>("[data-moment-id]")]
    .map((row) => view.moments.get(row.dataset.momentId!))
    .filter((m): m is Moment => m !== undefined);
  const turns = moments.flatMap((m) => m.turns.map((t) => view.turns.get(t))).filter((t): t is Turn => t !== undefined);
  return { moments, turns };
}

/** Draws a loaded image into a thumbnail of at most LAST_SEEN_THUMB_PX, as JPEG bytes. */
async function thumbnail(img: HTMLImageElement): Promise<ArrayBuffer | null> {
  if (!img.naturalWidth || !img.naturalHeight) return null;
  const { width, height } = fitWithin(img.naturalWidth, img.naturalHeight, LAST_SEEN_THUMB_PX);
  const canvas = document.createElement("canvas");
  canvas.width = width;
  canvas.height = height;
  const context = canvas.getContext("2d");
  if (!context) return null;
  context.drawImage(img, 0, 0, width, height);
  const blob = await new Promise<Blob | null>((resolve) => canvas.toBlob(resolve, "image/jpeg", THUMB_JPEG_QUALITY));
  return blob ? blob.arrayBuffer() : null;
}

/**
 * An image of the engine's media that did not load, with no thumbnail kept:
 * a plain box in its place, instead of a broken image. `data-missing` names
 * the photo ("Photo 2"), said "is not available offline" (or "could not be
 * loaded" while the engine answers); empty, the box is a bare thumbnail.
 */
function missing(img: HTMLImageElement): void {
  const name = img.dataset.missing;
  if (name === undefined || !img.isConnected) return;
  const box = document.createElement("div");
  box.className = "thumb missing";
  box.dataset.missing = "true";
  if (img.dataset.photo !== undefined) box.dataset.photo = img.dataset.photo;
  if (name) {
    const away = !navigator.onLine || document.getElementById("status")?.dataset.link !== "online";
    box.textContent = `${name} ${away ? "is not available offline" : "could not be loaded"}`;
    box.setAttribute("role", "img");
    box.setAttribute("aria-label", box.textContent);
  }
  img.replaceWith(box);
}

/** Object URLs of thumbnails shown in place of media that did not load, by media id. */
const fallbacks = new Map<string, string>();

/**
 * Keeps the last-seen feed from now on: saves it after each change of the
 * feed's rows once the engine has answered, keeps a thumbnail of each copy
 * that loads in the feed, and shows a kept thumbnail for an image of the
 * engine's media that fails to load.
 */
export function followLastSeen(view: FeedView): void {
  let live = document.body.dataset.ready === "true";
  let timer: ReturnType<typeof setTimeout> | undefined;
  /** Media ids with a thumbnail (or one being made). */
  const thumbed = new Set<string>();
  void store().then(async (db) => (await db?.thumbIds().catch(() => []))?.forEach((id) => thumbed.add(id)));

  const save = () => {
    clearTimeout(timer);
    timer = setTimeout(async () => {
      const db = await store();
      const { moments, turns } = shown(view);
      await db?.save(moments, turns).catch(() => undefined);
      // Thumbnails the save dropped may be made again.
      const kept = new Set(await db?.thumbIds().catch(() => []));
      for (const id of thumbed) if (!kept.has(id)) thumbed.delete(id);
    }, SAVE_DELAY_MS);
  };
  new MutationObserver(() => {
    if (live) save();
  }).observe(view.feed, { childList: true });
  // The engine answered: the feed is its feed from here on.
  new MutationObserver(() => {
    if (live || document.body.dataset.ready !== "true") return;
    live = true;
    document.getElementById("last-seen")?.remove();
    delete document.body.dataset.feed;
    save();
  }).observe(document.body, { attributes: true, attributeFilter: ["data-ready"] });

  view.feed.addEventListener(
    "load",
    (e) => {
      const img = e.target;
      if (!live || !(img instanceof HTMLImageElement)) return;
      const id = mediaId(img);
      const momentId = img.closest<HTMLElement>("[data-moment-id]")?.dataset.momentId;
      if (!id || !momentId || thumbed.has(id)) return;
      thumbed.add(id);
      void (async () => {
        const bytes = await thumbnail(img).catch(() => null);
        const db = await store();
        if (bytes && db) await db.putThumb({ media_id: id, moment_id: momentId, bytes, content_type: "image/jpeg" }).catch(() => undefined);
        else thumbed.delete(id);
      })();
    },
    true,
  );

  document.addEventListener(
    "error",
    (e) => {
      const img = e.target;
      if (!(img instanceof HTMLImageElement) || img.dataset.lastSeen) return;
      const id = mediaId(img);
      if (!id) return;
      void (async () => {
        let url = fallbacks.get(id);
        if (!url) {
          const thumb = await (await store())?.thumb(id).catch(() => undefined);
          if (!thumb) {
            missing(img);
            return;
          }
          url = URL.createObjectURL(new Blob([thumb.bytes], { type: thumb.content_type }));
          fallbacks.set(id, url);
        }
        img.dataset.lastSeen = "true";
        img.src = url;
      })();
    },
    true,
  );
}
