// The outbox in IndexedDB (SPEC section 6): captures with their media and
// every id minted before any request, and outgoing messages with ADR-036's
// states. Every write is one readwrite transaction with strict durability,
// so what a call wrote is on disk when its promise resolves.
import { openDB, type IDBPDatabase, type DBSchema } from "idb";

/** The steps of a capture's send, in the seed's order: the answer shows soonest. */
export const STEPS = ["create_moment", "upload_copy", "start_turn", "upload_original"] as const;
/** One step of a capture's send. */
export type Step = (typeof STEPS)[number];

/** A media file of a capture, as stored (its bytes live in the `blobs` store). */
export interface MediaFile {
  /** The phone-minted media id. */
  id: string;
  content_type: string;
  /** Bytes. */
  size: number;
  /** SHA-256, hex. */
  sha256: string;
}

/** Why an entry is parked: a permanent 4xx, for the person to see. */
export interface Parked {
  step: Step;
  status: number;
  code?: string;
  detail: string;
}

/** One capture in the outbox. */
export interface Entry {
  /** The entry id, which is also the moment create's request id; entries send in id order. */
  id: string;
  moment_id: string;
  turn_request_id: string;
  text: string | null;
  caption: string | null;
  lang: string | null;
  /** RFC 3339. */
  captured_at: string;
  copy: MediaFile;
  original: MediaFile;
  /** The steps done, each skipped on a retry. */
  done: Step[];
  state: "pending" | "parked" | "done";
  parked: Parked | null;
  /** The practical turn's id once started. */
  turn_id: string | null;
  /** The last passing trouble (a dropped link, a 503). */
  last_error: string | null;
  /**
   * Set once a create of the moment ended with no answer (the link dropped):
   * the engine may hold the moment though no step is done. An undo then
   * asks the engine first (`SparkClient.withdrawEntry`).
   */
  create_unanswered?: boolean;
}

/** Where a message stands (ADR-036). */
export type MessageState = "pending" | "sent" | "failed";

/** Why a message failed: `clock_skew` for a clock error, else the server's code (or `http_<status>`). */
export interface MessageError {
  code: string;
  detail: string;
}

/** One outgoing message. */
export interface MessageRecord {
  /** The message id, a ULID minted at a send attempt. */
  id: string;
  /** Its place in the outgoing order, kept across fresh ids. */
  order: number;
  /** How many times a fresh id replaced the first one. */
  generation: number;
  thread_id: string;
  body: string;
  /** Display time (RFC 3339): the id's time until 202 brings the server's `ts`. */
  ts: string;
  ts_from_server: boolean;
  state: MessageState;
  error: MessageError | null;
  last_error: string | null;
  /** Requests sent for it, over all its ids. */
  attempts: number;
}

interface Schema extends DBSchema {
  entries: { key: string; value: Entry };
  blobs: { key: string; value: { key: string; bytes: ArrayBuffer } };
  messages: { key: string; value: MessageRecord; indexes: { order: number } };
}

/** The default database name. */
export const DB_NAME = "spark-outbox";

/** The key of a media file's bytes. */
function blobKey(entryId: string, role: "copy" | "original"): string {
  return `${entryId}:${role}`;
}

/** An entry as a done one is kept: its ids and steps, not its content. */
function withoutContent(entry: Entry): Entry {
  return { ...entry, text: null, caption: null, lang: null };
}

/** The outbox: a handle on its IndexedDB database. */
export class Outbox {
  private constructor(readonly db: IDBPDatabase<Schema>) {}

  /** Opens (creating when new) the outbox database. */
  static async open(name: string = DB_NAME, factory?: IDBFactory): Promise<Outbox> {
    const previous = (globalThis as { indexedDB?: IDBFactory }).indexedDB;
    if (factory) (globalThis as { indexedDB?: IDBFactory }).indexedDB = factory;
    try {
      const db = await openDB<Schema>(name, 1, {
        upgrade(db) {
          db.createObjectStore("entries", { keyPath: "id" });
          db.createObjectStore("blobs", { keyPath: "key" });
          db.createObjectStore("messages", { keyPath: "id" }).createIndex("order", "order");
        },
      });
      const outbox = new Outbox(db);
      await outbox.dropContentOfDoneEntries();
      return outbox;
    } finally {
      if (factory) (globalThis as { indexedDB?: IDBFactory }).indexedDB = previous;
    }
  }

  /** Drops the text, caption and lang that done entries of earlier builds kept. */
  private async dropContentOfDoneEntries(): Promise<void> {
    const tx = this.tx(["entries"]);
    const entries = tx.objectStore("entries");
    const writes: Promise<unknown>[] = [];
    for (const entry of await entries.getAll()) {
      if (entry.state === "done" && (entry.text !== null || entry.caption !== null || entry.lang !== null)) {
        writes.push(entries.put(withoutContent(entry)));
      }
    }
    await Promise.all([...writes, tx.done]);
  }

  private tx<S extends "entries" | "blobs" | "messages">(stores: S[]) {
    return this.db.transaction(stores, "readwrite", { durability: "strict" });
  }

  /** Stores a capture and its media bytes in one transaction; durable when this resolves. */
  async putCapture(entry: Entry, copy: ArrayBuffer, original: ArrayBuffer): Promise<void> {
    const tx = this.tx(["entries", "blobs"]);
    await Promise.all([
      tx.objectStore("entries").put(entry),
      tx.objectStore("blobs").put({ key: blobKey(entry.id, "copy"), bytes: copy }),
      tx.objectStore("blobs").put({ key: blobKey(entry.id, "original"), bytes: original }),
      tx.done,
    ]);
  }

  /** Every entry, in send order (entry id). */
  async entries(): Promise<Entry[]> {
    return this.db.getAll("entries");
  }

  /** One entry. */
  async entry(id: string): Promise<Entry | undefined> {
    return this.db.get("entries", id);
  }

  /** A media file's bytes. */
  async bytes(entryId: string, role: "copy" | "original"): Promise<ArrayBuffer | undefined> {
    return (await this.db.get("blobs", blobKey(entryId, role)))?.bytes;
  }

  /**
   * Writes an entry's new state. Once it is done its bytes are dropped in
   * the same transaction, and its text, caption and lang are not kept on
   * the device (the engine holds them, and forgets them when the moment is
   * deleted: SPEC section 13); its ids stay, for an undo to answer
   * `acknowledged`.
   */
  async saveEntry(entry: Entry): Promise<void> {
    const tx = this.tx(["entries", "blobs"]);
    const stored = entry.state === "done" ? withoutContent(entry) : entry;
    const writes: Promise<unknown>[] = [tx.objectStore("entries").put(stored)];
    if (entry.state === "done") {
      writes.push(tx.objectStore("blobs").delete(blobKey(entry.id, "copy")));
      writes.push(tx.objectStore("blobs").delete(blobKey(entry.id, "original")));
    }
    await Promise.all([...writes, tx.done]);
  }

  /** Removes an entry and its bytes, in one transaction. */
  async removeEntry(id: string): Promise<void> {
    const tx = this.tx(["entries", "blobs"]);
    await Promise.all([
      tx.objectStore("entries").delete(id),
      tx.objectStore("blobs").delete(blobKey(id, "copy")),
      tx.objectStore("blobs").delete(blobKey(id, "original")),
      tx.done,
    ]);
  }

  /**
   * Forgets what the device still holds of a deleted moment: its done
   * entries and the sent messages of its thread (SPEC section 13: nothing
   * a person deleted is kept). What is still to be sent stays, to be seen
   * and removed by the person.
   */
  async forgetMoment(momentId: string): Promise<void> {
    const tx = this.tx(["entries", "messages"]);
    const entries = tx.objectStore("entries");
    const messages = tx.objectStore("messages");
    const removals: Promise<unknown>[] = [];
    for (const entry of await entries.getAll()) {
      if (entry.moment_id === momentId && entry.state === "done") removals.push(entries.delete(entry.id));
    }
    for (const record of await messages.getAll()) {
      if (record.thread_id === momentId && record.state === "sent") removals.push(messages.delete(record.id));
    }
    await Promise.all([...removals, tx.done]);
  }

  /** Every message, in outgoing order. */
  async messages(): Promise<MessageRecord[]> {
    return this.db.getAllFromIndex("messages", "order");
  }

  /** One message. */
  async message(id: string): Promise<MessageRecord | undefined> {
    return this.db.get("messages", id);
  }

  /** The next place in the outgoing order. */
  async nextOrder(): Promise<number> {
    const tx = this.db.transaction("messages");
    const cursor = await tx.store.index("order").openCursor(null, "prev");
    return cursor ? cursor.value.order + 1 : 1;
  }

  /** Writes a message record (its state changed; the id stays). */
  async saveMessage(record: MessageRecord): Promise<void> {
    const tx = this.tx(["messages"]);
    await Promise.all([tx.objectStore("messages").put(record), tx.done]);
  }

  /** Replaces a message's record under a fresh id: the old record is removed and the new one written, atomically. */
  async renewMessage(oldId: string, record: MessageRecord): Promise<void> {
    const tx = this.tx(["messages"]);
    await Promise.all([tx.objectStore("messages").delete(oldId), tx.objectStore("messages").put(record), tx.done]);
  }

  /** Closes the database. */
  close(): void {
    this.db.close();
  }
}
