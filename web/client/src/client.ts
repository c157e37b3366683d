// The browser client of SPEC sections 6 and 12: capture into the outbox,
// the drain in the seed's order with the answer classes, ADR-036's message
// rules, and one sending tab (a Web Lock) that holds the only EventSource
// while the others hear of changes over a BroadcastChannel.
import { backoffDelay, classify, DEFAULT_BACKOFF, type Backoff, type Refusal, type Verdict, type WaitCause } from "./answers.js";
import { systemClock, type Clock } from "./clock.js";
import type { components } from "./generated/api.js";
import { CLOCK_WINDOW_MS, REUSE_MARGIN_MS } from "./generated/rules.js";
import { mintRequestId, mintUlid, sha256Hex, ulidTime } from "./ids.js";
import { makeCopy as canvasCopy } from "./image.js";
import { entrySteps, MAX_PHOTOS, Outbox, type Entry, type MessageError, type MessageRecord, type PhotoFiles, type PlannedStep, type Role, type Step } from "./outbox.js";

type Schemas = components["schemas"];
/** A change notice from `/api/events` (SPEC section 4). */
export type ChangeNotice = Schemas["ChangeNotice"];

/** One photo of a capture before it is stored. */
export interface PhotoInput {
  /** The photo as taken (sent after the turn started, as the original). */
  photo: Blob;
  /** The small copy the brain reads; made from `photo` in a canvas when left out. */
  copy?: Blob;
}

/**
 * What a capture holds before it is stored: one photo (`photo`, with an
 * optional `copy`) or several (`photos`, 1 to {@link MAX_PHOTOS}, in the
 * order the brain reads them), and the text.
 */
export interface CaptureInput {
  /** The photo as taken, for a capture of one photo (sent last, as the original). */
  photo?: Blob;
  /** The small copy of `photo`; made from it in a canvas when left out. */
  copy?: Blob;
  /** The photos of a capture of several, in photo order (photo 0 first); instead of `photo`. */
  photos?: PhotoInput[];
  text?: string | null;
  caption?: string | null;
  lang?: string | null;
  capturedAt?: Date;
}

/** How a client is made. */
export interface ClientOptions {
  /**
   * The engine's origin; `""` (the default) is the page's own. In a
   * browser it must be the page's origin: the engine grants no CORS
   * preflight (every request carries `X-Spark-Client`, so even a GET needs
   * one), and a cross-origin request fails as a network error would
   * (`link` stays `reconnecting`). Serve the page from the engine or from
   * a reverse proxy in front of it. Scripts (Node) may name any origin.
   */
  baseUrl?: string;
  /** A bearer token, for scripts; a page signed in with `POST /api/session` needs none (the cookie goes along). */
  token?: string;
  fetch?: typeof fetch;
  clock?: Clock;
  /** The IndexedDB database name (one outbox per name). */
  dbName?: string;
  /**
   * An IndexedDB factory; default the page's (`globalThis.indexedDB`). In
   * Node use `import "fake-indexeddb/auto"` (it also defines the
   * `IDBRequest` and friends that the outbox's `idb` needs), not a bare
   * `new IDBFactory()`.
   */
  indexedDB?: IDBFactory;
  /** Makes the small copy (default: a canvas, at most 1024 px JPEG). */
  makeCopy?: (photo: Blob) => Promise<Blob>;
  /** Elect one sending tab with the Web Lock of this name (default on when `navigator.locks` exists). */
  tabs?: boolean;
  /** Open the event stream in the sending tab (default on when `EventSource` exists). */
  events?: boolean;
  /** The `EventSource` constructor (default the page's; tests give a stand-in). */
  eventSource?: EventSourceConstructor;
  backoff?: Backoff;
  random?: () => number;
  /** BroadcastChannel and Web Lock name. */
  channelName?: string;
  /** Send by itself when this tab is the sender (default true); false leaves it to {@link SparkClient.drainOnce} (tests). */
  autoSend?: boolean;
  /**
   * How long a request may go unanswered before it counts as lost (a hung
   * engine, a dropped link), in ms: default {@link DEFAULT_REQUEST_TIMEOUT_MS};
   * a request with a byte body (a media upload) gets one more second per
   * {@link UPLOAD_BYTES_PER_S} bytes on top.
   */
  requestTimeoutMs?: number;
  /**
   * The most bytes of a JSON request body the engine takes
   * (`limits.json_body_bytes`; default {@link MAX_JSON_BODY_BYTES}): a
   * capture whose text would make its create larger throws at
   * {@link SparkClient.capture}, before anything is stored, rather than
   * park on a `413` that no retry can fix.
   */
  maxJsonBodyBytes?: number;
}

/** The engine's default limit of a JSON request body, in bytes (`limits.json_body_bytes`, SPEC section 9: 64 KiB). */
export const MAX_JSON_BODY_BYTES = 65_536;
/** Bytes a moment's create takes beside its text, caption and language (its ids, its time and the JSON around them), with room to spare. */
const CREATE_BODY_ROOM_BYTES = 512;

/** How long a request without a byte body may go unanswered (ms) before it counts as lost. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 20_000;
/** The slowest upload rate a media upload is given time for (bytes a second): 10 MB in about 5 minutes. */
export const UPLOAD_BYTES_PER_S = 32 * 1024;

/** A request's byte body's size, or 0. */
function byteSize(body: BodyInit | undefined): number {
  if (body instanceof Blob) return body.size;
  if (body instanceof ArrayBuffer || ArrayBuffer.isView(body)) return body.byteLength;
  return 0;
}

/** What one pass over the outbox did. */
export interface PassReport {
  requests: number;
  /** Steps done and messages settled (sent or failed) in this pass. */
  stepsDone: number;
  /** Set when the pass ended on passing trouble. */
  wait: WaitCause | null;
}

type Broadcast =
  | { type: "change"; notice: ChangeNotice }
  | { type: "resync"; resync: Resync }
  | { type: "outbox" }
  | { type: "kick" }
  | { type: "sender"; sender: boolean }
  | { type: "link"; link: Link }
  | { type: "sendstate"; state: SendState };

/**
 * What the sending tab is doing with the outbox, for every tab to show:
 * the capture step whose request is in flight, and when the next pass
 * comes after passing trouble (ms since the epoch; null when none is due).
 */
export interface SendState {
  /** The request in flight: its entry, its step and, for an upload, which photo. */
  sending: { entry: string; step: Step; photo?: number } | null;
  nextPassAt: number | null;
}

/**
 * What an undo of a capture ({@link SparkClient.withdrawEntry}) did:
 * `undone` (removed from the outbox with its media; the engine has none of
 * it), `acknowledged` (too late: the engine has the moment, it stays and
 * the rest is sent), `unknown` (a create went out with no answer and the
 * engine cannot be asked now: nothing is removed), `gone` (no such entry).
 */
export type WithdrawOutcome = "undone" | "acknowledged" | "unknown" | "gone";

/**
 * Whether the engine answers, as this client last saw it: `online` (an
 * answer came, or the event stream is open), `reconnecting` (the browser
 * has a network but the engine did not answer), `offline` (the browser has
 * no network). `unknown` before the first answer or failure.
 */
export type Link = "unknown" | "online" | "reconnecting" | "offline";

/** What an `EventSource` constructor takes and gives, as far as the client uses it. */
export type EventSourceConstructor = new (url: string, init?: EventSourceInit) => EventSource;

/**
 * The detail of a `resync` event: the server's log is not the history the
 * stream followed (`409 cursor_unknown`: a restore and a take-over, a
 * failover to another archive's replica) or ends before what it saw
 * (`409 cursor_ahead`). What the page derived from the stream may hold ops
 * the server does not: refetch it. The stream follows after `head_cursor`.
 * Also emitted (code `late_start`) when the stream could not open at first
 * (offline, signed out) and starts from the head when it can: changes
 * between the page's load and that head were not heard.
 */
export interface Resync {
  /** The code of the refusal (`cursor_unknown` or `cursor_ahead`), or `late_start`. */
  code: string;
  /** The cursor the stream asked for. */
  after: string;
  /** The server's head, which the stream follows after from now on. */
  head_cursor: string;
  head_seq: number;
}

/** The problem codes of `GET /api/events` that call for a resynchronisation. */
const RESYNC_CODES = ["cursor_unknown", "cursor_ahead"];

/** The header every request carries: a cross-site form cannot send it, so a cookie-authenticated write with it is the page's own (SPEC section 12). */
export const CLIENT_HEADER = "X-Spark-Client";

function rfc3339(ms: number): string {
  return new Date(ms).toISOString();
}

/** The client. Make one with {@link SparkClient.open}; it emits `ready`, `outbox` (the outbox changed), `change` (detail: a ChangeNotice), `resync` (detail: a {@link Resync}: refetch what the changes built), `sender` (detail: whether this tab sends) and `status`. */
export class SparkClient extends EventTarget {
  readonly baseUrl: string;
  readonly clock: Clock;
  /** Whether this tab is the one that sends and holds the event stream. */
  isSender = false;
  /** The last passing trouble, for a status line (null when the link is fine). */
  lastWait: WaitCause | null = null;
  /** Resolves once storage is open and the first load is done. */
  readonly ready: Promise<void>;
  /** The last seq heard on the event stream. */
  lastSeq = 0;
  /** The cursor of the last change heard (its event's id, `SEQ.CHAIN`; `"0"` before any): where the stream resumes. */
  cursor = "0";
  /** Whether the engine answers, as last seen (by this tab, or heard from the sending tab); a change emits `status`. */
  link: Link = "unknown";
  /** What the sending tab is doing with the outbox (heard from it in the other tabs); a change emits `outbox`. */
  sendState: SendState = { sending: null, nextPassAt: null };

  private readonly fetchFn: typeof fetch;
  private readonly options: ClientOptions;
  private readonly backoff: Backoff;
  private channel: BroadcastChannel | null = null;
  private source: EventSource | null = null;
  /** How many times the event stream was opened. */
  private opens = 0;
  private wake: (() => void) | null = null;
  /** A kick came while a pass ran (no sleep to cut short): pass again at once. */
  private kickedInPass = false;
  /** The run loop's sleep timer, and whether it is a backoff (not the idle pass). */
  private timer: ReturnType<typeof setTimeout> | null = null;
  private backingOff = false;
  /** Waits in a row without progress (the backoff's step). */
  private waits = 0;
  private closed = false;
  private releaseLock: (() => void) | null = null;
  private chain: Promise<unknown> = Promise.resolve();
  /** The step lock's queue in this tab, when there are no Web Locks. */
  private stepChain: Promise<unknown> = Promise.resolve();
  private running = false;
  private readyResolve!: () => void;

  private constructor(readonly outbox: Outbox, options: ClientOptions) {
    super();
    this.options = options;
    this.baseUrl = options.baseUrl ?? "";
    this.clock = options.clock ?? systemClock;
    this.fetchFn = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
    this.backoff = options.backoff ?? DEFAULT_BACKOFF;
    this.ready = new Promise((resolve) => (this.readyResolve = resolve));
  }

  /** Opens the outbox, joins the tabs and, when this tab is elected, starts sending. `ready` fires once storage is open and the first load is done. */
  static async open(options: ClientOptions = {}): Promise<SparkClient> {
    const outbox = await Outbox.open(options.dbName, options.indexedDB);
    const client = new SparkClient(outbox, options);
    await client.start();
    return client;
  }

  private get name(): string {
    return this.options.channelName ?? "spark-client";
  }

  private async start(): Promise<void> {
    if (typeof BroadcastChannel !== "undefined") {
      this.channel = new BroadcastChannel(this.name);
      this.channel.onmessage = (e: MessageEvent<Broadcast>) => this.heard(e.data);
    }
    // The first load: read what the outbox holds.
    await this.outbox.entries();
    await this.outbox.messages();
    const locks = (globalThis as { navigator?: { locks?: LockManager } }).navigator?.locks;
    const useTabs = this.options.tabs ?? Boolean(locks);
    if (useTabs && locks) {
      // The lock is held until this tab closes (or close()); the next
      // waiting tab gets it then and becomes the sender.
      void locks.request(`${this.name}:sender`, () => {
        if (this.closed) return;
        return new Promise<void>((release) => {
          this.releaseLock = release;
          this.becomeSender();
        });
      });
    } else {
      this.becomeSender();
    }
    if (typeof window !== "undefined") {
      window.addEventListener("online", () => {
        this.setLink("reconnecting");
        this.kick();
        // Ask the engine at once (an open event stream, or an outbox with
        // nothing to send, would otherwise leave "reconnecting" standing).
        void this.get("/api/log/head").catch(() => undefined);
      });
      window.addEventListener("offline", () => this.setLink("offline"));
    }
    this.readyResolve();
    // After open() has resolved, so that listeners added to the client it
    // returns hear it (or await `client.ready`).
    setTimeout(() => this.dispatchEvent(new Event("ready")), 0);
  }

  private becomeSender(): void {
    this.isSender = true;
    this.dispatchEvent(new CustomEvent("sender", { detail: true }));
    this.post({ type: "sender", sender: true });
    if (this.options.events ?? typeof EventSource !== "undefined") void this.openEvents();
    if (this.options.autoSend !== false) void this.run();
  }

  private heard(message: Broadcast): void {
    if (message.type === "change") this.noticeArrived(message.notice, false);
    else if (message.type === "resync") this.resynced(message.resync, false);
    else if (message.type === "outbox") this.dispatchEvent(new Event("outbox"));
    else if (message.type === "kick" && this.isSender) this.kick();
    else if (message.type === "sender") this.dispatchEvent(new Event("status"));
    else if (message.type === "link" && !this.isSender) this.setLink(message.link, false);
    else if (message.type === "sendstate" && !this.isSender) {
      this.sendState = message.state;
      this.dispatchEvent(new Event("outbox"));
    }
  }

  private post(message: Broadcast): void {
    this.channel?.postMessage(message);
  }

  /**
   * Records whether the engine answers; a change emits `status` (and, from
   * the sending tab, tells the others). When the engine answers again after
   * the link was lost (the event stream reopened, a request got through),
   * the sending tab drains at once instead of waiting out its backoff: a
   * capture made while the engine was away goes as soon as it can.
   */
  private setLink(link: Link, tell = true): void {
    const offline = typeof navigator !== "undefined" && navigator.onLine === false;
    const next: Link = link === "reconnecting" && offline ? "offline" : link;
    if (next === this.link) return;
    const back = next === "online" && (this.link === "reconnecting" || this.link === "offline");
    this.link = next;
    this.dispatchEvent(new Event("status"));
    if (tell && this.isSender) this.post({ type: "link", link: next });
    if (back && this.isSender) this.kick();
  }

  /** Notes what one request's verdict says of the link. */
  private noteVerdict(verdict: Verdict): void {
    if (verdict.kind === "wait" && verdict.cause.kind === "link") this.setLink("reconnecting");
    else this.setLink("online");
  }

  private outboxChanged(): void {
    this.dispatchEvent(new Event("outbox"));
    this.post({ type: "outbox" });
  }

  private noticeArrived(notice: ChangeNotice, fromStream: boolean): void {
    this.lastSeq = Math.max(this.lastSeq, notice.seq);
    this.dispatchEvent(new CustomEvent<ChangeNotice>("change", { detail: notice }));
    if (fromStream) this.post({ type: "change", notice });
  }

  private resynced(resync: Resync, fromStream: boolean): void {
    this.lastSeq = resync.head_seq;
    this.dispatchEvent(new CustomEvent<Resync>("resync", { detail: resync }));
    if (fromStream) this.post({ type: "resync", resync });
  }

  private eventsUrl(): string {
    return `${this.baseUrl}/api/events?after=${encodeURIComponent(this.cursor)}`;
  }

  private async openEvents(): Promise<void> {
    if (this.closed) return;
    const reopening = this.opens > 0;
    this.opens += 1;
    if (this.cursor === "0") {
      try {
        const head = (await this.get("/api/log/head")) as Schemas["LogHead"];
        this.cursor = head.cursor;
        this.lastSeq = Math.max(this.lastSeq, head.seq);
        // The stream could not start at first (offline, signed out): it
        // follows from this head, later than what the page loaded.
        if (reopening) this.resynced({ code: "late_start", after: "0", head_cursor: head.cursor, head_seq: head.seq }, true);
      } catch {
        // Offline: follow from the start of what the stream gives.
      }
    }
    const Source = this.options.eventSource ?? EventSource;
    const source = new Source(this.eventsUrl(), { withCredentials: true });
    this.source = source;
    source.onopen = () => this.setLink("online");
    source.onmessage = (e) => {
      try {
        const notice = JSON.parse(e.data) as ChangeNotice;
        // The id is the change's cursor; the browser sends it back as
        // Last-Event-ID when it reconnects by itself.
        if (e.lastEventId) this.cursor = e.lastEventId;
        this.noticeArrived(notice, true);
      } catch {
        // Not a notice: ignore.
      }
    };
    const reopen = () => {
      source.close();
      if (this.source === source) this.source = null;
      if (!this.closed) setTimeout(() => void this.openEvents(), 1000 + Math.random() * 2000);
    };
    source.addEventListener("overflow", (e) => {
      const data = JSON.parse((e as MessageEvent).data) as { resume_after: number; resume_cursor?: string };
      if (data.resume_cursor && data.resume_after >= this.lastSeq) this.cursor = data.resume_cursor;
      reopen();
    });
    source.onerror = () => {
      // The browser retries by itself (with Last-Event-ID) unless the
      // answer was not a stream (401, 503, a 409 that calls for a
      // resynchronisation): then ask why, and reopen.
      if (source.readyState === 2 /* CLOSED */) {
        source.close();
        void this.checkCursor().finally(reopen);
      } else {
        // CONNECTING: the stream dropped and the browser is trying again.
        this.setLink("reconnecting");
      }
    };
  }

  /**
   * Asks the server once whether the cursor is still a point of its history
   * (an EventSource cannot see why it was refused): a `409 cursor_unknown`
   * or `cursor_ahead` moves the cursor to the head it names and emits
   * `resync`; any other answer changes nothing (a stream that opened is
   * dropped unread).
   */
  private async checkCursor(): Promise<void> {
    const abort = new AbortController();
    // A hung engine answers nothing: give up as a request would.
    const timer = setTimeout(() => abort.abort(), this.options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS);
    try {
      const h: Record<string, string> = { [CLIENT_HEADER]: "web" };
      if (this.options.token) h["Authorization"] = `Bearer ${this.options.token}`;
      const answer = await this.fetchFn(this.eventsUrl(), { headers: h, credentials: "include", cache: "no-store", signal: abort.signal });
      this.setLink("online");
      if (answer.status === 401) {
        // The session ended (or the token is gone): say so, as a send that
        // met a 401 would, so that the page can ask for a sign-in.
        // Emitted each time (not only on a change): the same 401 seen before
        // a sign-in is news after it.
        this.lastWait = { kind: "passing", status: 401, reason: "HTTP 401 the event stream needs a session" };
        this.dispatchEvent(new Event("status"));
        return;
      }
      if (answer.status !== 409) return;
      const problem = (await answer.json().catch(() => null)) as { code?: string; head_cursor?: string; head_seq?: number } | null;
      if (!problem || !RESYNC_CODES.includes(problem.code ?? "") || typeof problem.head_cursor !== "string") return;
      const after = this.cursor;
      this.cursor = problem.head_cursor;
      this.resynced({ code: problem.code!, after, head_cursor: problem.head_cursor, head_seq: problem.head_seq ?? 0 }, true);
    } catch {
      // Offline: the reopen tries again.
      this.setLink("reconnecting");
    } finally {
      clearTimeout(timer);
      abort.abort();
    }
  }

  /** Sends a kick: the sender drains now (from another tab, over the channel). */
  kick(): void {
    if (!this.isSender) this.post({ type: "kick" });
    else if (this.wake) this.wake();
    else this.kickedInPass = true;
  }

  private async run(): Promise<void> {
    if (this.running) return;
    this.running = true;
    this.waits = 0;
    while (!this.closed && this.isSender) {
      this.kickedInPass = false;
      this.setSendState({ nextPassAt: null });
      const report = await this.drainOnce().catch((e: Error) => ({ requests: 0, stepsDone: 0, wait: { kind: "link", reason: String(e) } as WaitCause }));
      const sleep = new Promise<void>((resolve) => {
        this.wake = () => {
          if (this.timer !== null) clearTimeout(this.timer);
          this.timer = null;
          this.wake = null;
          resolve();
        };
        if (report.wait) {
          // Waits in a row without progress: a pass that got something
          // through starts the backoff again from its first step.
          this.waits = report.stepsDone > 0 ? 1 : this.waits + 1;
          this.backingOff = true;
          const delay = backoffDelay(report.wait, this.waits, this.backoff, this.options.random);
          this.timer = setTimeout(this.wake, delay);
          this.setSendState({ nextPassAt: Date.now() + delay });
        } else {
          this.waits = 0;
          this.backingOff = false;
          this.setSendState({ nextPassAt: null });
          // Idle until a capture, a message or `online`; a slow safety pass.
          this.timer = setTimeout(this.wake, 30_000);
        }
      });
      this.noteWait(report.wait);
      // New work (a capture stored while the pass read the outbox before it): no sleep.
      if (this.kickedInPass) this.wake?.();
      await sleep;
    }
    this.running = false;
  }

  /** Records the last passing trouble (or its end) and emits `status` when it changed. */
  private noteWait(wait: WaitCause | null): void {
    if (wait?.reason !== this.lastWait?.reason) {
      this.lastWait = wait;
      this.dispatchEvent(new Event("status"));
    }
  }

  /**
   * A send outside the run loop (a message sent at once) met passing
   * trouble: the next pass comes after the backoff's next step, not after
   * the idle pass. A loop already backing off keeps its (shorter) timer.
   */
  private backOffFrom(wait: WaitCause): void {
    this.noteWait(wait);
    if (!this.wake || this.backingOff) return;
    this.waits += 1;
    this.backingOff = true;
    if (this.timer !== null) clearTimeout(this.timer);
    const delay = backoffDelay(wait, this.waits, this.backoff, this.options.random);
    this.timer = setTimeout(this.wake, delay);
    this.setSendState({ nextPassAt: Date.now() + delay });
  }

  /** Updates {@link sendState}: emits `outbox` here and, from the sending tab, tells the others. */
  private setSendState(change: Partial<SendState>): void {
    const next = { ...this.sendState, ...change };
    const same = next.sending?.entry === this.sendState.sending?.entry && next.sending?.step === this.sendState.sending?.step && next.sending?.photo === this.sendState.sending?.photo;
    if (same && next.nextPassAt === this.sendState.nextPassAt) return;
    this.sendState = next;
    this.dispatchEvent(new Event("outbox"));
    if (this.isSender) this.post({ type: "sendstate", state: next });
  }

  /**
   * Runs `work` holding the outbox's step lock: one capture step (its
   * request and the write of its outcome) at a time across the tabs, so an
   * undo in any tab never takes an entry away while a request of it is in
   * flight. A Web Lock when the browser has them, else a queue in this tab.
   */
  private stepLocked<T>(work: () => Promise<T>): Promise<T> {
    const locks = (globalThis as { navigator?: { locks?: LockManager } }).navigator?.locks;
    if (locks && this.options.tabs !== false) return locks.request(`${this.name}:step`, work) as Promise<T>;
    const next = this.stepChain.then(work, work);
    this.stepChain = next.catch(() => undefined);
    return next;
  }

  /** Runs `work` after every send already queued in this tab (one request at a time). */
  private serial<T>(work: () => Promise<T>): Promise<T> {
    const next = this.chain.then(work, work);
    this.chain = next.catch(() => undefined);
    return next;
  }

  /**
   * One request to the engine, with the client header (and the bearer token when given).
   * An object body is sent as JSON, and so is a string unless `headers` name another
   * `Content-Type`: the engine reads a body as JSON only when it is declared so (else
   * `415 unsupported_media_type`), and a browser would send a bare string as `text/plain`.
   * Bytes (media) are sent with the `Content-Type` that `headers` give.
   */
  async request(method: string, path: string, body?: BodyInit | object, headers: Record<string, string> = {}): Promise<Response> {
    const h: Record<string, string> = { [CLIENT_HEADER]: "web", ...headers };
    if (this.options.token) h["Authorization"] = `Bearer ${this.options.token}`;
    let payload: BodyInit | undefined;
    if (body instanceof ArrayBuffer || body instanceof Blob || body instanceof Uint8Array) {
      payload = body as BodyInit;
    } else if (typeof body === "string") {
      payload = body;
      if (!Object.keys(h).some((name) => name.toLowerCase() === "content-type")) h["Content-Type"] = "application/json";
    } else if (body !== undefined) {
      payload = JSON.stringify(body);
      h["Content-Type"] = "application/json";
    }
    // A hung engine or a dropped link answers nothing: after the timeout
    // the request is aborted and fails as a lost answer does (a retry
    // sends the same ids).
    // A long poll (`?wait=N`, in seconds) is given its N seconds on top.
    const size = byteSize(payload);
    const poll = Number(/[?&]wait=(\d+)/.exec(path)?.[1] ?? 0) * 1000;
    const limit = (this.options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS) + poll + (size ? Math.ceil((size / UPLOAD_BYTES_PER_S) * 1000) : 0);
    const abort = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        const error = new Error(`no answer in ${Math.round(limit / 1000)} s (timed out)`);
        error.name = "TimeoutError";
        abort.abort(error);
        reject(error);
      }, limit);
    });
    try {
      return await Promise.race([this.fetchFn(`${this.baseUrl}${path}`, { method, headers: h, body: payload, credentials: "include", cache: "no-store", signal: abort.signal }), timedOut]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** A GET whose 2xx JSON body is returned; anything else throws with the problem's detail. */
  async get(path: string): Promise<unknown> {
    let response: Response;
    try {
      response = await this.request("GET", path);
    } catch (e) {
      this.setLink("reconnecting");
      throw e;
    }
    this.setLink("online");
    const body = await response.json().catch(() => null);
    if (!response.ok) throw new Error(`${response.status} ${(body as { code?: string; detail?: string } | null)?.code ?? ""} ${(body as { detail?: string } | null)?.detail ?? ""}`.trim());
    return body;
  }

  private async send(method: string, path: string, body?: BodyInit | object, headers?: Record<string, string>): Promise<Verdict> {
    let result: Response | Error;
    try {
      result = await this.request(method, path, body, headers);
    } catch (e) {
      result = e instanceof Error ? e : new Error(String(e));
    }
    const verdict = await classify(result, this.clock.now());
    this.noteVerdict(verdict);
    return verdict;
  }

  /**
   * Stores a capture: mints the moment id, the entry id (the moment
   * create's request id), the turn's request id and, per photo, the copy
   * and original ids; makes the small copies, hashes every file and writes
   * it all in one transaction. When this resolves the capture is durable
   * and its ids are final; the sending tab sends it. One photo (`photo`)
   * or up to {@link MAX_PHOTOS} (`photos`); anything else, or a text
   * too long for the engine's JSON body limit
   * ({@link ClientOptions.maxJsonBodyBytes}), throws before anything is
   * stored.
   */
  async capture(input: CaptureInput): Promise<Entry> {
    const inputs = captureInputs(input);
    const most = (this.options.maxJsonBodyBytes ?? MAX_JSON_BODY_BYTES) - CREATE_BODY_ROOM_BYTES;
    const textBytes = new TextEncoder().encode(JSON.stringify([input.text ?? null, input.caption ?? null, input.lang ?? null])).byteLength;
    if (textBytes > most) throw new Error(`the text is too long for one moment (${textBytes} bytes; the engine takes at most ${most})`);
    const makeCopy = this.options.makeCopy ?? canvasCopy;
    const files = await Promise.all(
      inputs.map(async (p) => {
        const copy = p.copy ?? (await makeCopy(p.photo));
        const [copyBytes, originalBytes] = await Promise.all([copy.arrayBuffer(), p.photo.arrayBuffer()]);
        const [copySha, originalSha] = await Promise.all([sha256Hex(copyBytes), sha256Hex(originalBytes)]);
        return { copy, photo: p.photo, copyBytes, originalBytes, copySha, originalSha };
      }),
    );
    const id = mintRequestId(this.clock);
    const momentId = mintUlid(this.clock);
    const turnRequestId = mintRequestId(this.clock);
    const photos: PhotoFiles[] = files.map((f, photo) => ({
      photo,
      copy: { id: mintUlid(this.clock), content_type: f.copy.type || "image/jpeg", size: f.copyBytes.byteLength, sha256: f.copySha },
      original: { id: mintUlid(this.clock), content_type: f.photo.type || "application/octet-stream", size: f.originalBytes.byteLength, sha256: f.originalSha },
    }));
    const entry: Entry = {
      id,
      moment_id: momentId,
      turn_request_id: turnRequestId,
      text: input.text ?? null,
      caption: input.caption ?? null,
      lang: input.lang ?? null,
      captured_at: rfc3339((input.capturedAt ?? new Date(this.clock.now())).getTime()),
      photos,
      done: [],
      state: "pending",
      parked: null,
      turn_id: null,
      last_error: null,
    };
    await this.outbox.putCapture(entry, files.map((f) => ({ copy: f.copyBytes, original: f.originalBytes })));
    this.outboxChanged();
    this.kick();
    return entry;
  }

  /** Makes a parked entry pending again (the steps done stay done). */
  async retryEntry(id: string): Promise<void> {
    const entry = await this.outbox.entry(id);
    if (entry?.state !== "parked") return;
    entry.state = "pending";
    entry.parked = null;
    await this.outbox.saveEntry(entry);
    this.outboxChanged();
    this.kick();
  }

  /** Removes an entry that is not being sent (parked, or pending in no pass), with its bytes; a moment already made stays. */
  async removeEntry(id: string): Promise<void> {
    await this.serial(() => this.outbox.removeEntry(id));
    this.outboxChanged();
  }

  /**
   * Undoes a capture that the engine has not acknowledged: removes the
   * entry and its media from the outbox, so nothing of it is sent. Taken
   * under the step lock: when a request of the entry is in flight (mid-send)
   * the undo waits for its answer and then decides. Never after the moment's
   * create was acknowledged (`acknowledged`: it stays and the rest is sent;
   * delete the moment to be rid of it). When a create went out and its
   * answer was lost, the engine is asked (`GET /api/moments/{id}`) first:
   * `404` (or `410`) removes it, the moment there means `acknowledged`, no
   * answer means `unknown` (nothing removed; try again later).
   */
  async withdrawEntry(id: string): Promise<WithdrawOutcome> {
    const outcome = await this.stepLocked(async (): Promise<WithdrawOutcome> => {
      const entry = await this.outbox.entry(id);
      if (!entry || entry.state === "done") return entry ? "acknowledged" : "gone";
      if (entry.done.includes("create_moment")) return "acknowledged";
      if (entry.create_unanswered) {
        let answer: Response;
        try {
          answer = await this.request("GET", `/api/moments/${entry.moment_id}`);
        } catch {
          return "unknown";
        }
        if (answer.ok) return "acknowledged";
        if (answer.status !== 404 && answer.status !== 410) return "unknown";
      }
      await this.outbox.removeEntry(id);
      return "undone";
    });
    this.outboxChanged();
    return outcome;
  }

  private stepRequest(entry: Entry, { step, photo }: PlannedStep): Promise<Verdict> {
    switch (step) {
      case "create_moment":
        return this.send("POST", "/api/moments", {
          id: entry.moment_id,
          client_request_id: entry.id,
          text: entry.text,
          caption: entry.caption,
          lang: entry.lang,
          captured_at: entry.captured_at,
        } satisfies Schemas["CreateMomentRequest"]);
      case "start_turn":
        return this.send("POST", `/api/moments/${entry.moment_id}/turns`, {
          client_request_id: entry.turn_request_id,
          mode: "practical",
        } satisfies Schemas["StartTurnRequest"]);
      case "upload_copy":
      case "upload_original":
        return this.upload(entry, step === "upload_copy" ? "copy" : "original", photo ?? 0);
    }
  }

  /** Uploads one photo's copy or original: `PUT /api/media/{id}` with its moment, role and `X-Photo` number. */
  private async upload(entry: Entry, role: Role, photo: number): Promise<Verdict> {
    const files = entry.photos.find((p) => p.photo === photo);
    const bytes = files && (await this.outbox.bytes(entry.id, role, photo));
    if (!files || !bytes) {
      return { kind: "refused", refusal: { status: 0, code: "missing_bytes", detail: `the ${role}'s bytes of photo ${photo + 1} are not in the outbox`, body: null } };
    }
    const media = files[role];
    return this.send("PUT", `/api/media/${media.id}`, bytes, {
      "X-Moment-Id": entry.moment_id,
      "X-Media-Role": role,
      "X-Photo": String(photo),
      "Content-Type": media.content_type,
      "X-Content-SHA256": media.sha256,
    });
  }

  /**
   * One pass: every pending entry's steps in order (moment, each photo's
   * copy, turn, each photo's original), each step done skipped, then every
   * pending message. Passing
   * trouble ends the pass (the link is in trouble, not one entry); a
   * permanent 4xx parks its entry and the pass goes on with the next.
   */
  drainOnce(): Promise<PassReport> {
    return this.serial(() => this.pass());
  }

  private async pass(): Promise<PassReport> {
    const report: PassReport = { requests: 0, stepsDone: 0, wait: null };
    // No network at all (the browser knows): nothing is tried, so nothing
    // of a capture can reach the engine, and an undo needs no answer.
    if (typeof navigator !== "undefined" && navigator.onLine === false) {
      report.wait = { kind: "link", reason: "offline: this device has no network" };
      return report;
    }
    const ids = (await this.outbox.entries()).filter((e) => e.state === "pending").map((e) => e.id);
    for (const id of ids) {
      const first = await this.outbox.entry(id);
      if (!first) continue;
      const plan = entrySteps(first);
      for (const planned of plan) {
        const { step, photo, key } = planned;
        // Each step under the step lock, on the entry as stored now: an
        // undo between two steps took it away, or it is done or parked.
        const outcome = await this.stepLocked(async (): Promise<"next" | "stop" | "wait"> => {
          const entry = await this.outbox.entry(id);
          if (!entry || entry.state !== "pending") return "stop";
          if (entry.done.includes(key)) return "next";
          report.requests += 1;
          this.setSendState({ sending: { entry: id, step, ...(photo === null ? {} : { photo }) } });
          let verdict: Verdict;
          try {
            verdict = await this.stepRequest(entry, planned);
          } finally {
            this.setSendState({ sending: null });
          }
          if (verdict.kind === "wait") {
            entry.last_error = verdict.cause.reason;
            if (step === "create_moment" && verdict.cause.kind === "link") entry.create_unanswered = true;
            await this.outbox.saveEntry(entry);
            this.outboxChanged();
            report.wait = verdict.cause;
            return "wait";
          }
          if (verdict.kind === "refused") {
            entry.state = "parked";
            entry.parked = { step, ...(photo === null ? {} : { photo }), status: verdict.refusal.status, code: verdict.refusal.code, detail: verdict.refusal.detail };
            await this.outbox.saveEntry(entry);
            this.outboxChanged();
            return "stop";
          }
          if (step === "start_turn") {
            entry.turn_id = (verdict.body as Schemas["TurnStartedAnswer"] | null)?.turn?.id ?? null;
          }
          entry.done.push(key);
          entry.last_error = null;
          report.stepsDone += 1;
          if (plan.every((p) => entry.done.includes(p.key))) entry.state = "done";
          await this.outbox.saveEntry(entry);
          this.outboxChanged();
          return "next";
        });
        if (outcome === "wait") return report;
        if (outcome === "stop") break;
      }
    }
    const waiting = new Set((await this.outbox.entries()).filter((e) => e.state !== "done" && !e.done.includes("create_moment")).map((e) => e.moment_id));
    for (const record of await this.outbox.messages()) {
      if (record.state !== "pending" || waiting.has(record.thread_id)) continue;
      const outcome = await this.sendRecord(record, false);
      report.requests += outcome.attempts;
      if (!outcome.wait) report.stepsDone += 1;
      if (outcome.wait) {
        report.wait = outcome.wait;
        return report;
      }
    }
    return report;
  }

  /**
   * Sends a message to a moment's thread: mints its id from the page's
   * clock, stores it `pending` (durably), and, in the sending tab, sends it
   * at once (ADR-036: at most one immediate retry under a fresh id). In
   * another tab, or when the link is down, it stays pending and the
   * sender's drain sends it.
   */
  async sendMessage(threadId: string, body: string): Promise<MessageRecord> {
    if (!body.trim()) throw new Error("a message needs a body");
    const record = await this.serial(async () => {
      const id = mintUlid(this.clock);
      const record: MessageRecord = {
        id,
        order: await this.outbox.nextOrder(),
        generation: 0,
        thread_id: threadId.toUpperCase(),
        body,
        ts: rfc3339(ulidTime(id)),
        ts_from_server: false,
        state: "pending",
        error: null,
        last_error: null,
        attempts: 0,
      };
      await this.outbox.saveMessage(record);
      this.outboxChanged();
      if (!this.isSender) return record;
      const entries = await this.outbox.entries();
      if (entries.some((e) => e.moment_id === record.thread_id && e.state !== "done" && !e.done.includes("create_moment"))) return record;
      const outcome = await this.sendRecord(record, true);
      if (outcome.wait) this.backOffFrom(outcome.wait);
      return outcome.record;
    });
    if (!this.isSender) this.kick();
    return record;
  }

  /** Makes a failed message pending again, without its error; the sender sends it (with the same id while within the reuse margin). */
  async retryMessage(id: string): Promise<void> {
    const record = await this.outbox.message(id);
    if (record?.state !== "failed") return;
    record.state = "pending";
    record.error = null;
    await this.outbox.saveMessage(record);
    this.outboxChanged();
    this.kick();
  }

  private async renew(record: MessageRecord): Promise<void> {
    const old = record.id;
    record.id = mintUlid(this.clock);
    record.generation += 1;
    record.ts = rfc3339(ulidTime(record.id));
    record.ts_from_server = false;
    await this.outbox.renewMessage(old, record);
  }

  /**
   * One send of a message (SPEC section 6, ADR-036). `mintedNow`: the id
   * was minted for this very send. A reused id older than the reuse margin
   * (4 minutes, from the OpenAPI document) on the page's clock is replaced
   * first; `clock_skew` on a reused id replaces it and tries once more at
   * once; `clock_skew` on a fresh id fails the message with a clock text.
   */
  private async sendRecord(record: MessageRecord, mintedNow: boolean): Promise<{ record: MessageRecord; attempts: number; wait: WaitCause | null }> {
    let reused = !mintedNow;
    if (reused && Math.abs(this.clock.now() - ulidTime(record.id)) > REUSE_MARGIN_MS) {
      await this.renew(record);
      reused = false;
    }
    let attempts = 0;
    for (;;) {
      attempts += 1;
      record.attempts += 1;
      record.error = null;
      const verdict = await this.send("POST", "/api/messages", { id: record.id, thread_id: record.thread_id, body: record.body } satisfies Schemas["PostMessageRequest"]);
      let wait: WaitCause | null = null;
      if (verdict.kind === "done") {
        const ts = (verdict.body as Schemas["MessagePostedAnswer"] | null)?.message?.ts;
        if (ts) {
          record.ts = ts;
          record.ts_from_server = true;
        }
        record.state = "sent";
        record.last_error = null;
      } else if (verdict.kind === "refused" && verdict.refusal.code === "clock_skew") {
        if (reused) {
          // The skew may come from the id's age alone: drop it and try
          // once more, at once, with a fresh one.
          await this.renew(record);
          reused = false;
          continue;
        }
        record.state = "failed";
        record.error = clockError(verdict.refusal);
      } else if (verdict.kind === "refused") {
        record.state = "failed";
        record.error = { code: verdict.refusal.code ?? `http_${verdict.refusal.status}`, detail: verdict.refusal.detail };
      } else {
        record.last_error = verdict.cause.reason;
        wait = verdict.cause;
      }
      await this.outbox.saveMessage(record);
      this.outboxChanged();
      return { record, attempts, wait };
    }
  }

  /** Stops sending, closes the stream, the channel and the database, and hands the sender's lock to the next tab. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.isSender = false;
    this.source?.close();
    this.wake?.();
    this.releaseLock?.();
    this.channel?.close();
    this.outbox.close();
  }
}

/**
 * The clock text of a message refused with `clock_skew`, in plain words:
 * how far off this device's clock is and which way (from the problem's
 * `skew_ms` and `server_time_ms` when it has them), the window, and what
 * to do.
 */
export function clockError(refusal: Refusal): MessageError {
  const body = refusal.body as { skew_ms?: number; server_time_ms?: number } | null;
  const todo = `A message may be at most ${CLOCK_WINDOW_MS / 60_000} minutes off. Set this device's date and time (automatic is best), then send again with Retry.`;
  if (body && typeof body.skew_ms === "number" && typeof body.server_time_ms === "number") {
    // skew_ms is the id's time minus the server's: below 0, this device is behind.
    const way = body.skew_ms < 0 ? "behind" : "ahead of";
    return {
      code: "clock_skew",
      detail: `Not sent: this device's clock is off by about ${(Math.abs(body.skew_ms) / 60_000).toFixed(1)} minutes (${way} the engine's, which reads ${new Date(body.server_time_ms).toUTCString()}). ${todo}`,
    };
  }
  return { code: "clock_skew", detail: `Not sent: this device's clock is off from the engine's (${refusal.detail}). ${todo}` };
}

/** The photos of a capture, checked: one (`photo`) or 1 to {@link MAX_PHOTOS} (`photos`). */
function captureInputs(input: CaptureInput): PhotoInput[] {
  if (input.photos !== undefined && (input.photo !== undefined || input.copy !== undefined)) throw new Error("a capture takes `photo` (and `copy`) or `photos`, not both");
  const photos = input.photos ?? (input.photo !== undefined ? [input.copy !== undefined ? { photo: input.photo, copy: input.copy } : { photo: input.photo }] : []);
  if (!photos.length) throw new Error("a capture needs a photo");
  if (photos.length > MAX_PHOTOS) throw new Error(`a moment holds at most ${MAX_PHOTOS} photos, not ${photos.length}`);
  return photos;
}
