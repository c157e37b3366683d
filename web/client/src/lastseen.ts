// The feed as this device last saw it from the engine, in IndexedDB, for a
// start without the engine (SPEC section 12: a browser is a client that
// works offline): the moments in feed order, their turns, and small
// thumbnails of the copies the person saw. Never the truth: a page shows it
// only until the engine answers, then what the engine says replaces it
// (and, saved again, the snapshot). A moment gone from the feed loses its
// thumbnail at the next save, so an erased moment does not stay on the
// device past the next load of the feed.
import { openDB, type IDBPDatabase, type DBSchema } from "idb";
import type { components } from "./generated/api.js";

type Moment = components["schemas"]["Moment"];
type Turn = components["schemas"]["Turn"];

/** The default database name. */
export const LAST_SEEN_DB_NAME = "spark-last-seen";
/** Thumbnails kept at most: those of the newest moments of the snapshot. */
export const LAST_SEEN_THUMBS_MAX = 60;
/** The longest side of a thumbnail, in px. */
export const LAST_SEEN_THUMB_PX = 320;

/** The feed as last seen: moments newest first, the turns they name, and when it was saved (ms since the epoch). */
export interface Snapshot {
  saved_at_ms: number;
  moments: Moment[];
  turns: Turn[];
}

/** A thumbnail of a moment's copy: the media id it shows, its moment, the image bytes and their type. */
export interface Thumb {
  media_id: string;
  moment_id: string;
  bytes: ArrayBuffer;
  content_type: string;
}

interface Schema extends DBSchema {
  snapshot: { key: string; value: Snapshot };
  thumbs: { key: string; value: Thumb };
}

/** The one snapshot's key. */
const FEED = "feed";

/** The last-seen feed: a handle on its IndexedDB database (apart from the outbox's). */
export class LastSeen {
  private constructor(readonly db: IDBPDatabase<Schema>) {}

  /** Opens (creating when new) the database. */
  static async open(name: string = LAST_SEEN_DB_NAME, factory?: IDBFactory): Promise<LastSeen> {
    const previous = (globalThis as { indexedDB?: IDBFactory }).indexedDB;
    if (factory) (globalThis as { indexedDB?: IDBFactory }).indexedDB = factory;
    try {
      const db = await openDB<Schema>(name, 1, {
        upgrade(db) {
          db.createObjectStore("snapshot");
          db.createObjectStore("thumbs", { keyPath: "media_id" });
        },
      });
      return new LastSeen(db);
    } finally {
      if (factory) (globalThis as { indexedDB?: IDBFactory }).indexedDB = previous;
    }
  }

  /** The feed as last saved, or undefined when none was. */
  async read(): Promise<Snapshot | undefined> {
    return this.db.get("snapshot", FEED);
  }

  /**
   * Saves `moments` (newest first) with the turns they name, and drops
   * every thumbnail that is not of one of the newest
   * [`LAST_SEEN_THUMBS_MAX`] of them; one transaction. An empty feed (a
   * sign-out) leaves nothing.
   */
  async save(moments: Moment[], turns: Turn[], nowMs: number = Date.now()): Promise<void> {
    const named = new Set(moments.flatMap((m) => m.turns));
    const keep = new Set(moments.slice(0, LAST_SEEN_THUMBS_MAX).map((m) => m.id));
    const tx = this.db.transaction(["snapshot", "thumbs"], "readwrite");
    const thumbs = tx.objectStore("thumbs");
    const work: Promise<unknown>[] = [
      tx.objectStore("snapshot").put({ saved_at_ms: nowMs, moments, turns: turns.filter((t) => named.has(t.id)) }, FEED),
    ];
    for (const thumb of await thumbs.getAll()) {
      if (!keep.has(thumb.moment_id)) work.push(thumbs.delete(thumb.media_id));
    }
    await Promise.all([...work, tx.done]);
  }

  /** Keeps a thumbnail (the next [`save`] drops it unless its moment is one of the newest). */
  async putThumb(thumb: Thumb): Promise<void> {
    await this.db.put("thumbs", thumb);
  }

  /** The thumbnail of media `mediaId`, if kept. */
  async thumb(mediaId: string): Promise<Thumb | undefined> {
    return this.db.get("thumbs", mediaId);
  }

  /** The media ids with a thumbnail. */
  async thumbIds(): Promise<string[]> {
    return this.db.getAllKeys("thumbs");
  }

  /** Closes the database. */
  close(): void {
    this.db.close();
  }
}
