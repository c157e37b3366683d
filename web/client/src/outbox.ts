// The outbox in IndexedDB (SPEC section 6): captures with their media and
// every id minted before any request, and outgoing messages with ADR-036's
// states. Every write is one readwrite transaction with strict durability,
// so what a call wrote is on disk when its promise resolves.
//
// A capture holds up to MAX_PHOTOS photos (issue 27: several photos per
// moment), each a copy and an original uploaded with its `X-Photo` number.
// Entries stored by the build before (one `copy` and one `original`) are
// read as photo 0: they are rewritten when the outbox opens, and read so
// wherever they come from (see `normaliseEntry`). Photo 0's bytes and step
// names are the ones that build used, so what it had done stays done.
import { openDB, type IDBPDatabase, type DBSchema } from "idb";

/** The steps of a capture's send, in the seed's order: the answer shows soonest. With several photos the uploads repeat per photo: the moment, every copy, the turn, every original. */
export const STEPS = ["create_moment", "upload_copy", "start_turn", "upload_original"] as const;
/** One step of a capture's send. */
export type Step = (typeof STEPS)[number];
/** The most photos a moment holds (`X-Photo` 0 to 9). */
export const MAX_PHOTOS = 10;
/** A media file's role. */
export type Role = "copy" | "original";

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

/** One photo of a capture: its number (`X-Photo`, 0 to 9, the order the brain reads them in), its copy and its original. */
export interface PhotoFiles {
  photo: number;
  copy: MediaFile;
  original: MediaFile;
}

/**
 * One request of a capture's send: the step and, for an upload, which
 * photo. `key` is what `Entry.done` records: the step's name for photo 0
 * (as the build before several photos recorded it) and `<step>:<photo>`
 * for the others.
 */
export interface PlannedStep {
  step: Step;
  photo: number | null;
  key: string;
}

/** The key `Entry.done` records for a step (of `photo`, for an upload). */
export function stepKey(step: Step, photo: number | null = null): string {
  return (step === "upload_copy" || step === "upload_original") && photo ? `${step}:${photo}` : step;
}

/** An entry's requests in send order: the moment, each photo's copy (in photo order), the turn, each photo's original. */
export function entrySteps(entry: Pick<Entry, "photos">): PlannedStep[] {
  const uploads = (step: Step) => entry.photos.map((p) => ({ step, photo: p.photo, key: stepKey(step, p.photo) }));
  return [
    { step: "create_moment", photo: null, key: "create_moment" },
    ...uploads("upload_copy"),
    { step: "start_turn", photo: null, key: "start_turn" },
    ...uploads("upload_original"),
  ];
}

/** Why an entry is parked: a permanent 4xx, for the person to see. */
export interface Parked {
  step: Step;
  /** The photo of an upload step (absent for the moment and the turn; entries parked before several photos lack it: photo 0). */
  photo?: number;
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
  /** The photos, in photo order (1 to MAX_PHOTOS). */
  photos: PhotoFiles[];
  /** The steps done (their {@link PlannedStep.key}), each skipped on a retry. */
  done: string[];
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
  entries: { key: string; value: StoredEntry };
  blobs: { key: string; value: { key: string; bytes: ArrayBuffer } };
  messages: { key: string; value: MessageRecord; indexes: { order: number } };
}

/** The default database name. */
export const DB_NAME = "spark-outbox";

/** The key of a media file's bytes: `<entry>:<role>` for photo 0 (as before several photos), `<entry>:<photo>:<role>` for the others. */
function blobKey(entryId: string, role: Role, photo = 0): string {
  return photo ? `${entryId}:${photo}:${role}` : `${entryId}:${role}`;
}

/** Every blob key of an entry (entry ids are ULIDs of one length, so the prefix is the entry's alone). */
function entryBlobs(entryId: string): IDBKeyRange {
  return IDBKeyRange.bound(`${entryId}:`, `${entryId}:\uffff`);
}

/** An entry as the build before several photos stored it. */
type StoredEntry = Entry | (Omit<Entry, "photos"> & { photos?: undefined; copy: MediaFile; original: MediaFile });

/**
 * An entry in this build's shape: one stored by the build before several
 * photos (`copy` and `original`, no `photos`) is its photo 0, with the same
 * blob keys and step names, so it sends as it would have. Anything else is
 * returned as it is.
 */
export function normaliseEntry(stored: StoredEntry): Entry {
  if (Array.isArray(stored.photos)) return stored as Entry;
  const { copy, original, ...rest } = stored as Omit<Entry, "photos"> & { copy: MediaFile; original: MediaFile };
  return { ...rest, photos: [{ photo: 0, copy, original }] };
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
      await outbox.upgradeEntries();
      return outbox;
    } finally {
      if (factory) (globalThis as { indexedDB?: IDBFactory }).indexedDB = previous;
    }
  }

  /**
   * Brings entries of earlier builds to this one's shape, in one
   * transaction: one photo (`copy`, `original`) becomes `photos` with photo
   * 0 (its bytes and done steps keep their keys), and the text, caption and
   * lang that done entries kept are dropped.
   */
  private async upgradeEntries(): Promise<void> {
    const tx = this.tx(["entries"]);
    const entries = tx.objectStore("entries");
    const writes: Promise<unknown>[] = [];
    for (const stored of await entries.getAll()) {
      let entry = normaliseEntry(stored);
      let changed = entry !== stored;
      if (entry.state === "done" && (entry.text !== null || entry.caption !== null || entry.lang !== null)) {
        entry = withoutContent(entry);
        changed = true;
      }
      if (changed) writes.push(entries.put(entry));
    }
    await Promise.all([...writes, tx.done]);
  }

  private tx<S extends "entries" | "blobs" | "messages">(stores: S[]) {
    return this.db.transaction(stores, "readwrite", { durability: "strict" });
  }

  /**
   * Stores a capture and its media bytes in one transaction; durable when
   * this resolves. `bytes[i]` are the bytes of `entry.photos[i]`.
   */
  async putCapture(entry: Entry, bytes: { copy: ArrayBuffer; original: ArrayBuffer }[]): Promise<void> {
    if (bytes.length !== entry.photos.length) throw new Error(`${entry.photos.length} photos but bytes of ${bytes.length}`);
    const tx = this.tx(["entries", "blobs"]);
    const blobs = tx.objectStore("blobs");
    await Promise.all([
      tx.objectStore("entries").put(entry),
      ...entry.photos.flatMap((p, i) => [
        blobs.put({ key: blobKey(entry.id, "copy", p.photo), bytes: bytes[i]!.copy }),
        blobs.put({ key: blobKey(entry.id, "original", p.photo), bytes: bytes[i]!.original }),
      ]),
      tx.done,
    ]);
  }

  /** Every entry, in send order (entry id). */
  async entries(): Promise<Entry[]> {
    return (await this.db.getAll("entries")).map(normaliseEntry);
  }

  /** One entry. */
  async entry(id: string): Promise<Entry | undefined> {
    const stored = await this.db.get("entries", id);
    return stored && normaliseEntry(stored);
  }

  /** A media file's bytes (of photo 0 unless `photo` says). */
  async bytes(entryId: string, role: Role, photo = 0): Promise<ArrayBuffer | undefined> {
    return (await this.db.get("blobs", blobKey(entryId, role, photo)))?.bytes;
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
    if (entry.state === "done") writes.push(tx.objectStore("blobs").delete(entryBlobs(entry.id)));
    await Promise.all([...writes, tx.done]);
  }

  /** Removes an entry and the bytes of all its photos, in one transaction. */
  async removeEntry(id: string): Promise<void> {
    const tx = this.tx(["entries", "blobs"]);
    await Promise.all([tx.objectStore("entries").delete(id), tx.objectStore("blobs").delete(entryBlobs(id)), tx.done]);
  }

  /**
   * Forgets what the device still holds of a deleted moment: its done
   * entries and the sent messages of its thread (SPEC section 13: nothing
   * a person deleted is kept). What is still to be sent stays, to be seen
   * and removed by the person, unless `unsent`: then the thread's messages
   * still to send, or failed, go too (a deleted moment takes none; the page
   * passes it once the moment's deletion is known).
   */
  async forgetMoment(momentId: string, { unsent = false }: { unsent?: boolean } = {}): Promise<void> {
    const tx = this.tx(["entries", "messages"]);
    const entries = tx.objectStore("entries");
    const messages = tx.objectStore("messages");
    const removals: Promise<unknown>[] = [];
    for (const entry of await entries.getAll()) {
      if (entry.moment_id === momentId && entry.state === "done") removals.push(entries.delete(entry.id));
    }
    for (const record of await messages.getAll()) {
      // A deleted moment's thread takes no message: with `unsent`, those still to send (or failed) go too.
      if (record.thread_id === momentId && (record.state === "sent" || unsent)) removals.push(messages.delete(record.id));
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
