// The engine's page (SPEC section 12): the moments feed, newest first a
// page at a time (`GET /api/moments?order=newest&after=&limit=`, with the
// turns of the moments shown only), live over the event stream through the
// client package (a change re-renders one row, not the list), capture of
// up to 10 photos per moment from files or the camera (a preview strip,
// each photo removable) with an undo while the engine has none of it, a
// moment with its photos, Pippa's reading as it arrives, keeping phrases,
// quick recall, "Read again" for a reading that failed, the message thread
// with pending and failed messages and a retry, every outbox state with what
// it waits for, and a log view with the head, the chain value and a live tail.
//
// The page works without the engine as far as it can: the outbox is read
// from this device before any request, a failed load is tried again with
// backoff (the status says so), and the status says whether the engine
// answers ("Online", "Reconnecting…", "Offline"), never a raw HTTP line.
import { SparkClient, DEFAULT_REQUEST_TIMEOUT_MS, MAX_PHOTOS, entrySteps, mintRequestId, statusClass, type ChangeNotice, type Entry, type MessageRecord, type Step, type WithdrawOutcome, type components } from "../../client/src/index.js";
import { followLastSeen, restoreLastSeen } from "./offline.js";
import { startAppShell } from "./shell.js";

type Moment = components["schemas"]["Moment"];
type Media = components["schemas"]["Media"];
type Turn = components["schemas"]["Turn"];
type Message = components["schemas"]["Message"];
type Mark = components["schemas"]["Mark"];
type LogHead = components["schemas"]["LogHead"];

const $ = <T extends HTMLElement = HTMLElement>(id: string) => document.getElementById(id) as T;

function el<K extends keyof HTMLElementTagNameMap>(tag: K, props: Partial<HTMLElementTagNameMap[K]> & Record<string, unknown> = {}, ...children: (Node | string | null)[]): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k.startsWith("data-") || k.startsWith("aria-")) node.setAttribute(k, String(v));
    else (node as unknown as Record<string, unknown>)[k] = v;
  }
  for (const c of children) if (c !== null) node.append(c);
  return node;
}

let client: SparkClient;
/**
 * The moments shown, by id; every change (a page read, a live create or
 * delete, a reload) brings the feed's count up to date.
 */
class ShownMoments extends Map<string, Moment> {
  override set(id: string, m: Moment): this {
    super.set(id, m);
    countLater();
    return this;
  }
  override delete(id: string): boolean {
    const had = super.delete(id);
    if (had) countLater();
    return had;
  }
  override clear(): void {
    super.clear();
    countLater();
  }
}
const moments = new ShownMoments();
let countQueued = false;
/** Renders the feed's count once the current task's changes are done. */
function countLater(): void {
  if (countQueued) return;
  countQueued = true;
  queueMicrotask(() => {
    countQueued = false;
    renderCount();
  });
}
/** Turns known, by id. */
const turns = new Map<string, Turn>();
/** The moment of each turn. */
const turnMoment = new Map<string, string>();
let openMoment: string | null = null;
const tail: ChangeNotice[] = [];
/** Each thread's messages as last read from the engine. */
const servedThreads = new Map<string, Message[]>();

async function api<T>(path: string): Promise<T> {
  return (await client.get(path)) as T;
}

async function post(method: string, path: string, body?: object): Promise<Response> {
  return client.request(method, path, body);
}

// ---- access -------------------------------------------------------------

/** At most `chars` characters of a text for a row's title (the whole text is in the moment's view), with "…" when cut. */
function clipped(text: string | null | undefined, chars = 160): string {
  if (!text) return "";
  const all = [...text];
  return all.length > chars ? `${all.slice(0, chars).join("")}…` : text;
}

/** Whether the engine lets us in: with tokens configured and no session, it says 401. Throws when it does not answer. */
async function signedIn(): Promise<boolean> {
  const answer = await fetch("/api/log/head", { credentials: "include", cache: "no-store", headers: { "X-Spark-Client": "web" }, signal: AbortSignal.timeout(DEFAULT_REQUEST_TIMEOUT_MS) });
  return answer.status !== 401;
}

/** The sign-in in progress, shared by everything that found the session missing. */
let signing: Promise<void> | null = null;

/** How many captures and messages wait on this device, in words ("" when none). */
async function waitingWords(): Promise<string> {
  const entries = (await client.outbox.entries()).filter((e) => e.state !== "done").length;
  const messages = (await client.outbox.messages()).filter((m) => m.state !== "sent").length;
  const parts = [entries ? `${entries} capture${entries === 1 ? "" : "s"}` : "", messages ? `${messages} message${messages === 1 ? "" : "s"}` : ""].filter(Boolean);
  return parts.join(" and ");
}

/**
 * Hides everything the session showed (the feed, a moment, the phrases)
 * and asks for a token; resolves once a session is made. The outbox stays
 * on this device and is sent after the sign-in.
 */
function signIn(why: string): Promise<void> {
  if (signing) return signing;
  document.body.dataset.signedIn = "false";
  $("app").hidden = true;
  $("nav").hidden = true;
  $("signout").hidden = true;
  clearShown();
  $("signin-error").textContent = "";
  $("signin-why").textContent = why;
  $("signin").hidden = false;
  void waitingWords().then((w) => ($("signin-waiting").textContent = w ? `${w} ${/^1 \w+$/.test(w) ? "waits" : "wait"} on this device; ${/^1 \w+$/.test(w) ? "it is" : "they are"} sent once you are signed in.` : ""));
  void setStatus();
  signing = new Promise((resolve) => {
    $("signin-form").onsubmit = async (e) => {
      e.preventDefault();
      const input = $<HTMLInputElement>("signin-token");
      const token = input.value.trim();
      // The token goes once, in a header, and is not kept: the answer
      // sets an HttpOnly session cookie.
      input.value = "";
      $("signin-error").textContent = "";
      let answer: Response;
      try {
        answer = await fetch("/api/session", { method: "POST", credentials: "include", headers: { Authorization: `Bearer ${token}`, "X-Spark-Client": "web" } });
      } catch {
        $("signin-error").textContent = "Not signed in: the engine did not answer. Try again when it is reachable.";
        return;
      }
      if (answer.ok) {
        $("signin").hidden = true;
        $("app").hidden = false;
        $("nav").hidden = false;
        document.body.dataset.signedIn = "true";
        signing = null;
        tokensConfigured = true;
        $("signout").hidden = false;
        resolve();
      } else {
        const problem = await answer.json().catch(() => ({}));
        $("signin-error").textContent = answer.status === 401 ? "Not signed in: this token is not valid." : `Not signed in: ${problem.detail ?? `HTTP ${answer.status}`}`;
      }
    };
  });
  return signing;
}

/** Whether the engine has tokens configured (then the page offers to sign out). */
let tokensConfigured = false;

/**
 * Asks the engine whether it has tokens configured: `POST /api/session`
 * with neither token nor new session answers `200` (no tokens: nothing to
 * exchange) or `400` (a session cookie cannot make a session).
 */
async function probeTokens(): Promise<void> {
  try {
    const answer = await post("POST", "/api/session", {});
    tokensConfigured = answer.status !== 200;
  } catch {
    // Unknown: leave it as it is.
  }
  $("signout").hidden = !tokensConfigured;
}

/** Ends the session on the engine (`DELETE /api/session`: the cookie is revoked and cleared), then asks for a token. */
async function signOut(): Promise<void> {
  let answer: Response;
  try {
    answer = await post("DELETE", "/api/session");
  } catch {
    flash("Not signed out: the engine did not answer, so the session could not be ended. Try again when it is reachable.");
    return;
  }
  if (!answer.ok && answer.status !== 401) {
    flash(`Not signed out: the engine answered HTTP ${answer.status}.`);
    return;
  }
  await signIn("You are signed out.");
  await afterSignIn();
}

/** After a sign-in: the feed again, and the outbox sent. */
async function afterSignIn(): Promise<void> {
  await connect();
  client.kick();
}

/** A short note in the status line's place for a few seconds. */
function flash(text: string): void {
  $("notice").textContent = text;
  $("notice").hidden = false;
  setTimeout(() => ($("notice").hidden = true), 8000);
}

/** Forgets what the session showed. */
function clearShown(): void {
  moments.clear();
  feedNext = undefined;
  feedGeneration += 1;
  offFeed = null;
  readAgains.clear();
  $("feed-more").hidden = true;
  $("feed-count").textContent = "";
  turns.clear();
  turnMoment.clear();
  servedThreads.clear();
  $("feed").querySelectorAll("[data-moment-id]").forEach((r) => r.remove());
  $("moment").replaceChildren();
  $("thread").replaceChildren();
  $("phrases").replaceChildren();
  $("recall-out").textContent = "";
  show("moments");
}

// ---- views --------------------------------------------------------------

function show(view: "moments" | "moment" | "recall" | "log"): void {
  window.scrollTo(0, 0);
  for (const v of ["moments", "moment", "recall", "log"]) $(`view-${v}`).hidden = v !== view;
  for (const b of document.querySelectorAll<HTMLButtonElement>("button[data-view]")) {
    if (b.dataset.view === view || (view === "moment" && b.dataset.view === "moments")) b.setAttribute("aria-current", "page");
    else b.removeAttribute("aria-current");
  }
  if (view !== "moment") {
    openMoment = null;
    // The URL says the feed (or the view) again, not the moment left.
    if (hashMoment()) history.replaceState(null, "", location.pathname + location.search);
  }
  if (view === "recall") void renderPhrases();
  if (view === "log") void renderHead();
}

/** Set while the first load (or a load after a sign-in) fails: why, and when it is tried again (ms since the epoch). */
let loadTrouble: { reason: string; retryAt: number } | null = null;

/** Whether the engine cannot be reached now (no network, no answer, the first load failing): what needs it says so at once. */
function engineAway(): boolean {
  return !navigator.onLine || client.link === "offline" || client.link === "reconnecting" || loadTrouble !== null;
}

/** What needs the engine, said at once while it cannot be reached. */
function needsEngine(what: string): string {
  return `${what} needs the engine, which this device cannot reach now (${!navigator.onLine || client.link === "offline" ? "offline" : "no answer"}). Try again when it is back.`;
}

/** Whether the engine answers, in words. */
function connectionWords(): string {
  if (!navigator.onLine || client?.link === "offline") return "Offline";
  if (loadTrouble) {
    const s = Math.max(0, Math.ceil((loadTrouble.retryAt - Date.now()) / 1000));
    return `Can't reach the engine (${loadTrouble.reason}); trying again ${s > 0 ? `in ${s} s` : "now"}`;
  }
  if (!client) return "Starting…";
  if (signing) return "Signed out";
  if (client.link === "reconnecting") return "Reconnecting…";
  if (client.lastWait?.kind === "server") return `The engine has trouble (HTTP ${client.lastWait.status}); trying again`;
  if (client.lastWait?.status === 429) return "The engine is busy; trying again";
  if (client.link === "online") return "Online";
  return "Connecting…";
}

async function setStatus(): Promise<void> {
  const parts = [connectionWords()];
  if (client) {
    const entries = (await client.outbox.entries()).filter((e) => e.state !== "done");
    const all = await client.outbox.messages();
    const messages = all.filter((m) => m.state === "pending");
    const waiting = entries.filter((e) => e.state === "pending").length + messages.length;
    const parked = entries.filter((e) => e.state === "parked").length + all.filter((m) => m.state === "failed").length;
    if (waiting) parts.push(`${waiting} waiting to send`);
    if (parked) parts.push(`${parked} need${parked === 1 ? "s" : ""} you`);
    $("status").dataset.sender = String(client.isSender);
    $("status").dataset.link = client.link;
  }
  $("status").textContent = parts.join(" · ");
}

/** A passing trouble of the outbox (a string the client stored) in plain words. */
function waitWords(reason: string | null): string {
  if (!reason) return "";
  if (reason.startsWith("offline")) return "Waiting for a network: this device is offline.";
  if (reason.startsWith("network")) return "Waiting for the engine: it did not answer the last try.";
  const status = Number(/^HTTP (\d{3})/.exec(reason)?.[1] ?? 0);
  if (status === 401) return "Waiting for you to sign in.";
  if (status === 403) return "Waiting: the engine refused access for now.";
  if (status === 429) return "Waiting: the engine is busy.";
  if (status >= 500) return `Waiting: the engine has trouble (HTTP ${status}).`;
  return "Waiting to be sent.";
}

// ---- the feed -----------------------------------------------------------

/**
 * The moment's copies in photo order (issue 27: up to 10 photos, each with
 * one copy). Media uploaded before several photos have no `photo` in a
 * feed saved by an earlier build: photo 0.
 */
function copies(m: Moment): Media[] {
  return m.media.filter((x) => x.role === "copy").sort((a, b) => (a.photo ?? 0) - (b.photo ?? 0));
}

/** How many photos the moment has (photos with a copy or an original). */
function photoCount(m: Moment): number {
  return new Set(m.media.map((x) => x.photo ?? 0)).size;
}

/** The copy the feed shows: photo 0's (the first photo's, whatever its number). */
function copyUrl(m: Moment): string | null {
  const copy = copies(m)[0];
  return copy ? `/api/media/${copy.id}` : null;
}

/** The moment's reading: its latest practical turn (a "Read again" starts a later one). Turn ids sort by time. */
function reading(m: Moment): Turn | undefined {
  let latest: Turn | undefined;
  for (const id of m.turns) {
    const t = turns.get(id);
    if (t?.mode === "practical" && (!latest || t.id > latest.id)) latest = t;
  }
  return latest;
}

function readingText(t: Turn | undefined): string {
  if (!t) return "";
  if (t.status === "done") return t.answer ?? "";
  if (t.status === "failed") return `The reading failed: ${t.error ?? ""}`;
  return "Pippa is reading…";
}

function momentRow(m: Moment): HTMLLIElement {
  const url = copyUrl(m);
  const t = reading(m);
  const row = el("li", {
    "data-moment-id": m.id, "data-version": m.version, "data-photos": photoCount(m), "data-reading": t?.status ?? "none", tabIndex: 0, role: "link",
    onclick: () => void openMomentView(m.id),
    onkeydown: (e: KeyboardEvent) => {
      if (e.key === "Enter" || e.key === " ") {
        e.preventDefault();
        void openMomentView(m.id);
      }
    },
  },
    url ? el("img", { src: url, alt: "", loading: "lazy", "data-missing": "" }) : el("div", { className: "thumb" }),
    el("div", {},
      el("div", { className: "title" }, clipped(m.text || m.caption) || "A sign"),
      el("div", { className: "snippet" }, readingText(t)),
      el("div", { className: "muted" }, new Date(m.created_at).toLocaleString(), photoCount(m) > 1 ? ` · ${photoCount(m)} photos` : ""),
      el("div", { className: "muted", "data-outbox-note": "" }, outboxNote(m.id)),
    ),
  );
  return row;
}

/** What of moment `id`'s capture this device still sends, in words ("" when nothing). */
function outboxNote(id: string): string {
  const e = outboxEntries.find((x) => x.moment_id === id && x.state === "pending");
  if (!e) return "";
  const sending = client.sendState.sending?.entry === e.id ? client.sendState.sending : null;
  return sending ? `Sending ${stepWords(e, sending.step, sending.photo)}…` : waitingFor(e);
}

const STEP_WORDS: Record<Step, string> = { create_moment: "the moment", upload_copy: "the small copy", start_turn: "the reading", upload_original: "the original photo" };

/** A step of a capture in words; an upload of a capture of several photos says which photo ("the original of photo 2"). */
function stepWords(e: Entry, step: Step, photo?: number | null): string {
  if (e.photos.length < 2 || (step !== "upload_copy" && step !== "upload_original")) return STEP_WORDS[step];
  return `${step === "upload_copy" ? "the small copy" : "the original"} of photo ${(photo ?? 0) + 1}`;
}

/** Object URLs of waiting captures' copies, by entry id. */
const thumbs = new Map<string, string>();

async function thumbUrl(e: Entry): Promise<string | null> {
  if (thumbs.has(e.id)) return thumbs.get(e.id)!;
  const first = e.photos[0];
  const bytes = first && (await client.outbox.bytes(e.id, "copy", first.photo).catch(() => undefined));
  if (!bytes) return null;
  const url = URL.createObjectURL(new Blob([bytes], { type: e.photos[0]?.copy.content_type ?? "image/jpeg" }));
  thumbs.set(e.id, url);
  return url;
}

/** The outbox's entries as last read (for what each waits for, and whether a moment's reading is still to be started by one). */
let outboxEntries: Entry[] = [];

/** What a waiting capture waits for, in a plain sentence. */
function waitingFor(e: Entry): string {
  if (!navigator.onLine || client.link === "offline") return "Waiting for a network: this device is offline. It is sent by itself when the network is back.";
  const next = client.sendState.nextPassAt;
  const retry = next && next > Date.now() ? ` Next try at ${new Date(next).toLocaleTimeString()}.` : "";
  const trouble = waitWords(e.last_error);
  if (trouble) return `${trouble}${retry}`;
  if (client.link === "reconnecting") return `Waiting for the engine to answer.${retry}`;
  const step = entrySteps(e).find((s) => !e.done.includes(s.key));
  if (e.done.length && step) return `The moment is on the engine; waiting to send ${stepWords(e, step.step, step.photo)}.`;
  const ahead = outboxEntries.filter((o) => o.state === "pending" && o.id < e.id).length;
  if (ahead) return `Waiting: ${ahead} capture${ahead === 1 ? "" : "s"} before it ${ahead === 1 ? "is" : "are"} sent first.`;
  return "Waiting to be sent.";
}

/** A row's button that does not open the row. */
function rowButton(label: string, action: () => Promise<void> | void, name?: string): HTMLButtonElement {
  return el("button", { type: "button", "aria-label": name ?? label, onclick: (ev: Event) => { ev.stopPropagation(); void action(); } }, label);
}

/** A capture in the outbox: waiting (what for), sending (which step) or parked (the engine's reason), with what can be done. */
function entryRow(e: Entry, thumb: string | null): HTMLLIElement {
  const sending = client.sendState.sending?.entry === e.id ? client.sendState.sending : null;
  const state = e.state === "parked" ? "parked" : sending ? "sending" : "pending";
  let detail: string;
  if (e.parked) {
    const made = e.done.includes("create_moment") ? "The moment is saved, but the engine refused " : "The engine refused ";
    detail = `${made}${stepWords(e, e.parked.step, e.parked.photo)}: ${e.parked.detail} (HTTP ${e.parked.status}${e.parked.code ? ` ${e.parked.code}` : ""}).`;
  } else if (sending) {
    detail = `Sending ${stepWords(e, sending.step, sending.photo)} (${e.done.length + 1} of ${entrySteps(e).length})…`;
  } else {
    detail = waitingFor(e);
  }
  const title = clipped(e.text) || "A sign";
  const several = e.photos.length > 1 ? `${e.photos.length} photos` : "";
  const badge = { parked: "not sent", sending: "sending", pending: "waiting" }[state];
  return el("li", { "data-entry-id": e.id, "data-outbox": state, "data-photos": e.photos.length },
    thumb ? el("img", { src: thumb, alt: "" }) : el("div", { className: "thumb" }),
    el("div", {},
      el("div", { className: "title" }, title, el("span", { className: `badge ${state}` }, badge)),
      several ? el("div", { className: "muted" }, several) : null,
      el("div", { className: "snippet", "data-detail": "" }, detail),
      e.state === "parked"
        ? el("div", { className: "row actions" },
            rowButton("Retry", () => client.retryEntry(e.id), `Retry “${title}”`),
            rowButton("Remove", async () => {
              if (!confirm(e.done.includes("create_moment") ? "Remove what is left of this capture from this device? The moment stays." : "Remove this capture from this device? It was not sent.")) return;
              await client.removeEntry(e.id);
            }, `Remove “${title}”`),
          )
        : !e.done.includes("create_moment")
          ? el("div", { className: "row actions" },
              rowButton("Remove", async () => {
                if (!confirm("Remove this capture from this device? The engine has none of it yet.")) return;
                flash(withdrawWords([await client.withdrawEntry(e.id)], e.photos.length));
              }, `Remove “${title}”`),
            )
          : null,
    ),
  );
}

/** A message that failed (ADR-036: a clock too far off, or a refusal), with Retry and a way to its thread. */
function failedMessageRow(r: MessageRecord): HTMLLIElement {
  return el("li", { "data-message-failed": r.id, "data-outbox": "failed" },
    el("div", { className: "thumb" }),
    el("div", {},
      el("div", { className: "title" }, `Message: “${r.body}”`, el("span", { className: "badge failed" }, "not sent")),
      el("div", { className: "snippet", "data-detail": "" }, messageError(r)),
      el("div", { className: "row actions" },
        rowButton("Retry", () => client.retryMessage(r.id), `Retry the message “${r.body}”`),
        rowButton("Open its moment", () => openMomentView(r.thread_id)),
      ),
    ),
  );
}

/** Moments changed while the feed's first page was read: refreshed once it is shown. */
const heardWhileLoading = new Set<string>();

/**
 * Fetches one moment and its turns, and re-renders its row (and the open
 * view) only. A moment older than the feed read so far is left for its
 * page; a new one is inserted in its place (the top, for a new capture).
 */
async function refreshMoment(id: string): Promise<void> {
  if (feedNext === undefined) {
    heardWhileLoading.add(id);
    return;
  }
  const open = offFeed?.id === id;
  if (!moments.has(id) && !withinFeed(id) && !open) return;
  let m: Moment;
  try {
    m = await api<Moment>(`/api/moments/${id}`);
  } catch {
    moments.delete(id);
    document.querySelector(`[data-moment-id="${id}"]`)?.remove();
    return;
  }
  for (const t of m.turns) turnMoment.set(t, m.id);
  await Promise.all(m.turns.map((t) => refreshTurn(t, false)));
  if (!moments.has(id) && !withinFeed(id)) {
    // Open, though the feed has not reached it.
    offFeed = m;
    if (openMoment === id) renderMoment();
    return;
  }
  const known = moments.has(id);
  moments.set(id, m);
  const row = momentRow(m);
  const old = document.querySelector(`#feed [data-moment-id="${id}"]`);
  if (old) old.replaceWith(row);
  else if (!known) insertRow(row);
  $("feed-empty").hidden = moments.size > 0;
  if (openMoment === id) renderMoment();
}

function insertRow(row: HTMLLIElement): void {
  // Newest first: ids sort by time.
  const id = row.dataset.momentId!;
  const feed = $("feed");
  const after = [...feed.querySelectorAll<HTMLElement>("[data-moment-id]")].find((r) => r.dataset.momentId! < id);
  feed.insertBefore(row, after ?? null);
}

/**
 * Keeps a turn as read. A turn ends once: a read that says `running` for a
 * turn known to have ended is an older answer come late (reads overlap:
 * the event stream's, a long poll's) and is dropped.
 */
function keepTurn(t: Turn): void {
  if (t.status === "running" && (turns.get(t.id)?.status ?? "running") !== "running") return;
  turns.set(t.id, t);
}

async function refreshTurn(id: string, rerender = true): Promise<void> {
  const t = await api<Turn>(`/api/turns/${id}`).catch(() => null);
  if (!t) return;
  keepTurn(t);
  turnMoment.set(id, t.moment_id);
  if (rerender && moments.has(t.moment_id)) {
    const row = document.querySelector(`#feed [data-moment-id="${t.moment_id}"]`);
    row?.replaceWith(momentRow(moments.get(t.moment_id)!));
  }
  if (rerender && openMoment === t.moment_id) renderMoment();
}

/** Moments a feed page holds: one screen and a little more, so the first paint needs few requests. */
const FEED_PAGE_MOMENTS = 30;
/**
 * Where the feed goes on: the `next` of the last page read (the oldest
 * moment shown), null once every moment is shown, undefined before the
 * first page.
 */
let feedNext: string | null | undefined;
/** Counts loads of the first page: a page read for an earlier one is dropped. */
let feedGeneration = 0;
/** The page of older moments being read, if any. */
let loadingMore: Promise<void> | null = null;

/** Whether moment `id` falls in the part of the feed read so far (newer than the oldest shown, or all read). Ids sort by time. */
function withinFeed(id: string): boolean {
  return feedNext === null || (feedNext !== undefined && id > feedNext);
}

/** Reads one feed page after `after` (newest first) and the turns of its moments only. */
async function feedPage(after: string | null): Promise<components["schemas"]["MomentPage"]> {
  const page: components["schemas"]["MomentPage"] = await api(`/api/moments?order=newest&limit=${FEED_PAGE_MOMENTS}${after ? `&after=${after}` : ""}`);
  for (const m of page.moments) for (const t of m.turns) turnMoment.set(t, m.id);
  await Promise.all(page.moments.flatMap((m) => m.turns.map((t) => refreshTurn(t, false))));
  return page;
}

/** Shows a page's moments below those shown (one already shown, say inserted live, is left as it is). */
function appendPage(page: components["schemas"]["MomentPage"]): void {
  const feed = $("feed");
  for (const m of page.moments) {
    if (moments.has(m.id)) continue;
    moments.set(m.id, m);
    feed.append(momentRow(m));
  }
  feedNext = page.next;
  $("feed-empty").hidden = moments.size > 0 || feed.querySelector("[data-entry-id]") !== null;
  renderMore();
}

/** Loads the feed's first page again (at start, after a sign-in, on a resync); the outbox's rows stay. */
async function loadFeed(): Promise<void> {
  const generation = ++feedGeneration;
  // Changes heard meanwhile wait for the new first page (then refreshed).
  const before = feedNext;
  feedNext = undefined;
  let page: components["schemas"]["MomentPage"];
  try {
    page = await feedPage(null);
  } catch (e) {
    if (generation === feedGeneration) feedNext = before;
    throw e;
  }
  if (generation !== feedGeneration) return;
  const openBefore = openMoment ? moments.get(openMoment) : undefined;
  moments.clear();
  $("feed").querySelectorAll("[data-moment-id]").forEach((r) => r.remove());
  appendPage(page);
  const heard = [...heardWhileLoading];
  heardWhileLoading.clear();
  await Promise.all(heard.map((id) => refreshMoment(id)));
  await recheckOpen(openBefore);
}

/**
 * The open moment once a load of the feed no longer holds it (older than
 * the first page, or deleted while this page was closed and shown from the
 * feed as last seen): read from the engine; deleted or unknown there, its
 * view says so (the controls of a moment the page no longer holds would do
 * nothing). No answer leaves it as it was shown.
 */
async function recheckOpen(shown: Moment | undefined): Promise<void> {
  const id = openMoment;
  if (!id || moments.has(id)) return;
  if (shown && offFeed?.id !== id) offFeed = shown;
  let answer: Response;
  try {
    answer = await client.request("GET", `/api/moments/${id}`);
  } catch {
    return;
  }
  if (answer.status === 404 || answer.status === 410) {
    momentGone(id);
    return;
  }
  if (!answer.ok) return;
  const m = (await answer.json()) as Moment;
  for (const t of m.turns) turnMoment.set(t, m.id);
  await Promise.all(m.turns.map((t) => refreshTurn(t, false)));
  if (openMoment !== id) return;
  offFeed = m;
  renderMoment();
}

/** Shows the next page of older moments ("Show older moments", or the end of the feed scrolled into view). */
function loadMore(): Promise<void> {
  if (loadingMore || !feedNext) return loadingMore ?? Promise.resolve();
  const generation = feedGeneration;
  const more = $<HTMLButtonElement>("feed-more");
  more.dataset.state = "loading";
  more.textContent = "Loading older moments…";
  loadingMore = feedPage(feedNext)
    .then((page) => {
      if (generation === feedGeneration) appendPage(page);
    })
    .catch(() => {
      more.dataset.state = "failed";
    })
    .finally(() => {
      loadingMore = null;
      renderMore();
      // A screen taller than a page: go on while the end stays in reach.
      const end = $("feed-more");
      if (!end.hidden && end.dataset.state !== "failed" && !$("view-moments").hidden && end.getBoundingClientRect().top < innerHeight + 600) void loadMore();
    });
  return loadingMore;
}

/** The control under the feed: shown while older moments remain; says when the last try failed. */
function renderMore(): void {
  const more = $<HTMLButtonElement>("feed-more");
  more.hidden = !feedNext;
  if (loadingMore) return;
  const failed = more.dataset.state === "failed";
  more.textContent = failed ? "Older moments did not load (no answer). Try again" : "Show older moments";
  if (!failed) more.dataset.state = "idle";
  renderCount();
}

/** "N moments shown" under the feed (and whether older ones remain). */
function renderCount(): void {
  $("feed-count").textContent = moments.size ? `${moments.size} moment${moments.size === 1 ? "" : "s"} shown${feedNext ? ", older ones below" : ""}` : "";
}

/**
 * The outbox at the top of the feed: captures waiting, sending or parked
 * (waiting ones until their moment shows; the moment's row then says what
 * of it is still being sent), and messages that failed. Also keeps the
 * undo of the last Save and the "Read again" control current.
 */
async function renderOutbox(): Promise<void> {
  const feed = $("feed");
  const entries = await client.outbox.entries();
  let failed = (await client.outbox.messages()).filter((r) => r.state === "failed");
  const late = failed.filter((r) => deletedMoments.has(r.thread_id));
  if (late.length) {
    // Refused as its moment's deletion arrived: forgotten as the others were.
    for (const id of new Set(late.map((r) => r.thread_id))) await client.outbox.forgetMoment(id, { unsent: true }).catch(() => undefined);
    failed = failed.filter((r) => !deletedMoments.has(r.thread_id));
  }
  outboxEntries = entries;
  // Waiting captures until their moment shows; parked ones always (a
  // capture parked after its moment was made still needs the person).
  const shown = entries.filter((e) => e.state === "parked" || (e.state === "pending" && !moments.has(e.moment_id)));
  const rows = await Promise.all(shown.map(async (e) => entryRow(e, await thumbUrl(e))));
  feed.querySelectorAll("[data-entry-id], [data-message-failed]").forEach((r) => r.remove());
  feed.prepend(...rows, ...failed.map(failedMessageRow));
  for (const note of feed.querySelectorAll<HTMLElement>("[data-moment-id] [data-outbox-note]")) {
    note.textContent = outboxNote(note.closest<HTMLElement>("[data-moment-id]")!.dataset.momentId!);
  }
  const live = new Set(shown.map((e) => e.id));
  for (const [id, url] of thumbs) {
    if (!live.has(id)) {
      URL.revokeObjectURL(url);
      thumbs.delete(id);
    }
  }
  $("feed-empty").hidden = moments.size > 0 || shown.length > 0 || failed.length > 0;
  renderUndo();
  renderReadAgain();
}

// ---- one moment ---------------------------------------------------------

/** A moment opened that the feed does not show (older than the pages read; from a failed message's row). */
let offFeed: Moment | null = null;

/** The open moment, as last read. */
function current(): Moment | undefined {
  if (!openMoment) return undefined;
  return moments.get(openMoment) ?? (offFeed?.id === openMoment ? offFeed : undefined);
}

/** The moment a URL opens (`#/moments/<id>`), or null. */
function hashMoment(): string | null {
  return /^#\/moments\/([0-9A-Za-z]{26})$/.exec(location.hash)?.[1]?.toUpperCase() ?? null;
}

/** The feed's row opened last: the keyboard goes back to it on the way back to the feed. */
let openedFrom: string | null = null;

/** Shows the feed with the keyboard on the row opened last. */
function showFeed(): void {
  show("moments");
  if (openedFrom) document.querySelector<HTMLElement>(`#feed [data-moment-id="${openedFrom}"]`)?.focus();
}

/**
 * Back to the feed from a moment ("← Moments", Escape, the view of a
 * deleted moment): the history entry the moment pushed is left (as the
 * browser's Back would), or, for a moment opened by its URL, the URL
 * becomes the feed's.
 */
function backToFeed(): void {
  if ((history.state as { pushed?: boolean } | null)?.pushed && hashMoment()) {
    history.back();
    return;
  }
  showFeed();
}

/**
 * Opens a moment. `how`: push a history entry (`#/moments/<id>`: Back, on
 * Android too, returns to the feed), replace the current one (a moment
 * opened by its URL), or leave history as it is (Back and Forward).
 */
async function openMomentView(id: string, how: "push" | "replace" | "none" = "push"): Promise<void> {
  if (!moments.has(id)) {
    let answer: Response | null = null;
    try {
      answer = await client.request("GET", `/api/moments/${id}`);
    } catch {
      // No answer: said below.
    }
    if (!answer?.ok) {
      // The URL goes back to what is shown (a moment's link that did not
      // open must not name another moment than the one on screen).
      const back = openMoment && !$("view-moment").hidden ? `#/moments/${openMoment}` : "";
      history.replaceState(back ? history.state : null, "", `${location.pathname}${location.search}${back}`);
      flash(
        answer === null
          ? "That moment could not be opened: the engine did not answer. Try again when it is back."
          : answer.status === 410
            ? "That moment was deleted (on this device or another)."
            : answer.status === 404
              ? "That moment does not exist on this engine (an old link, or one from another engine)."
              : `That moment could not be opened (HTTP ${answer.status}).`,
      );
      return;
    }
    const m = (await answer.json()) as Moment;
    for (const t of m.turns) turnMoment.set(t, m.id);
    await Promise.all(m.turns.map((t) => refreshTurn(t, false)));
    offFeed = m;
  }
  openMoment = id;
  show("moment");
  openMoment = id;
  openedFrom = id;
  delete $("view-moment").dataset.deleted;
  if (how === "push" && hashMoment() !== id) history.pushState({ pushed: true }, "", `#/moments/${id}`);
  else if (how !== "none") history.replaceState(null, "", `#/moments/${id}`);
  $("keep-status").textContent = "";
  $("edit-form").hidden = true;
  $("edit-status").textContent = "";
  renderMoment();
  $("moment").querySelector<HTMLElement>("h2")?.focus();
  await renderThread();
}

function renderMoment(): void {
  const m = current();
  if (!m) return;
  const shown = copies(m);
  const t = reading(m);
  const count = photoCount(m);
  // Every photo's copy, in photo order (the order the brain read them in).
  const photos = shown.length > 1
    ? el("ul", { className: "photos", "aria-label": `${shown.length} photos` },
        ...shown.map((c, i) => el("li", { "data-photo": c.photo ?? 0 }, el("img", { src: `/api/media/${c.id}`, alt: `photo ${i + 1} of ${shown.length}`, "data-missing": `Photo ${i + 1}` }))),
      )
    : shown[0] ? el("img", { src: `/api/media/${shown[0].id}`, alt: "the copy of the photo", "data-photo": shown[0].photo ?? 0, "data-missing": "The photo" }) : el("div", { className: "thumb" });
  $("moment").replaceChildren(
    photos,
    el("h2", { tabIndex: -1 }, m.text || m.caption || "A sign"),
    el("p", { className: "muted" }, `captured ${m.captured_at ? new Date(m.captured_at).toLocaleString() : "—"} · ${count === 1 ? "1 photo" : `${count} photos`} · version ${m.version}`),
    el("h3", {}, "Pippa's reading"),
    el("div", { className: "reading", id: "moment-reading", "data-status": t?.status ?? "none" }, readingText(t) || "No reading yet."),
  );
  renderReadAgain();
}

// ---- read again ---------------------------------------------------------

/**
 * A "Read again" asked of a moment: the request id it goes with (kept
 * while no answer came, so that trying again cannot start two readings:
 * SPEC section 3, a known request id answers with the turn it started),
 * whether it is in flight, and what the last try gave, in words.
 */
interface ReadAgain {
  requestId: string | null;
  busy: boolean;
  note: string;
  bad: boolean;
}
const readAgains = new Map<string, ReadAgain>();

/**
 * Whether the moment's reading can be asked for again: its latest practical
 * turn failed, or it has none (every turn known) and no capture on this
 * device is still to start one.
 */
function mayReadAgain(m: Moment): boolean {
  if (outboxEntries.some((e) => e.moment_id === m.id && e.state !== "done" && !e.done.includes("start_turn"))) return false;
  const t = reading(m);
  return t ? t.status === "failed" : m.turns.every((id) => turns.has(id));
}

/** The "Read again" control of the open moment: shown when a reading can be asked for, with the state of the last ask. */
function renderReadAgain(): void {
  const m = current();
  let state = m ? readAgains.get(m.id) : undefined;
  if (m && state && !state.busy && state.requestId && m.turns.some((id) => turns.get(id)?.request_id === state!.requestId)) {
    // The ask whose answer was lost got through (the event stream told of its turn).
    readAgains.delete(m.id);
    state = undefined;
  }
  const offer = Boolean(m && (mayReadAgain(m) || state?.busy));
  const running = m ? reading(m)?.status === "running" : false;
  $("read-again-row").hidden = !offer && !state?.note;
  const button = $<HTMLButtonElement>("read-again");
  button.hidden = !offer;
  button.textContent = m && reading(m) ? "Read again" : "Ask for a reading";
  button.setAttribute("aria-disabled", String(Boolean(state?.busy)));
  const status = $("read-again-status");
  status.className = state?.bad ? "error" : "muted";
  status.textContent = state?.note && !(running && !state.busy) ? state.note : "";
  $("read-again-row").dataset.state = state?.busy ? "asking" : state?.bad ? "failed" : running ? "reading" : "idle";
}

/** Passing trouble of an ask, in words (the ask keeps its request id: trying again is safe). */
function troubleWords(status: number): string {
  if (status === 401) return "you are not signed in";
  if (status === 403) return "the engine refused access for now";
  if (status === 429) return "the engine is busy";
  if (status >= 500) return `the engine has trouble (HTTP ${status})`;
  return `HTTP ${status}`;
}

/**
 * Asks the engine for a new practical reading of the open moment
 * (`POST /api/moments/{id}/turns`, SPEC section 4) under a fresh request
 * id: the failed turn's own request id would answer with that turn and ask
 * no brain. Trying again after no answer sends the same request id.
 */
async function readAgain(): Promise<void> {
  const m = current();
  if (!m) return;
  const state = readAgains.get(m.id) ?? { requestId: null, busy: false, note: "", bad: false };
  if (state.busy) return;
  state.requestId ??= mintRequestId(client.clock);
  Object.assign(state, { busy: true, note: "Asking Pippa for a new reading…", bad: false });
  readAgains.set(m.id, state);
  renderReadAgain();
  let answer: Response;
  try {
    answer = await client.request("POST", `/api/moments/${m.id}/turns`, { client_request_id: state.requestId, mode: "practical" });
  } catch {
    Object.assign(state, { busy: false, bad: true, note: "Not asked: the engine did not answer. Try again: the same request goes again, so the moment is read once." });
    renderReadAgain();
    return;
  }
  const body = (await answer.json().catch(() => null)) as (components["schemas"]["TurnStartedAnswer"] & { detail?: string }) | null;
  if (answer.ok && body?.turn) {
    const turn = body.turn;
    Object.assign(state, { busy: false, bad: false, requestId: null, note: "Pippa is reading it again…" });
    keepTurn(turn);
    turnMoment.set(turn.id, m.id);
    if (!m.turns.includes(turn.id)) m.turns = [...m.turns, turn.id];
    shown(m);
    void followTurn(turn.id);
    return;
  }
  state.busy = false;
  state.bad = true;
  if (statusClass(answer.status) === "permanent") {
    // Refused for good: nothing was started; a later ask is a new request.
    state.requestId = null;
    state.note = `Not asked: ${body?.detail ?? `HTTP ${answer.status}`}.`;
  } else {
    state.note = `Not asked: ${troubleWords(answer.status)}. Try again: the same request goes again, so the moment is read once.`;
  }
  renderReadAgain();
}

/** Follows a turn until it ends (`GET /api/turns/{id}?wait=`), showing it as it changes (the event stream may be down). */
async function followTurn(id: string): Promise<void> {
  for (let i = 0; i < 30; i += 1) {
    const t = await api<Turn>(`/api/turns/${id}?wait=20`).catch(() => null);
    if (!t) return;
    keepTurn(t);
    const m = moments.get(t.moment_id) ?? (offFeed?.id === t.moment_id ? offFeed : undefined);
    if (m) shown(m);
    if (t.status !== "running") {
      readAgains.delete(t.moment_id);
      renderReadAgain();
      return;
    }
  }
}

// ---- edit and delete ----------------------------------------------------

/** An `If-Match` on `version`: an edit or delete of another version is refused (`412`), never applied. */
function ifMatch(version: number | string): Record<string, string> {
  return { "If-Match": `"${version}"` };
}

/** The version the open edit form started from (a change heard meanwhile does not move it). */
let editingVersion: number | string | null = null;

function editNote(text: string, bad = false): void {
  $("edit-status").className = bad ? "error" : "muted";
  $("edit-status").textContent = text;
}

function openEdit(): void {
  const m = current();
  if (!m) return;
  if (engineAway()) {
    editNote(needsEngine("Editing"), true);
    return;
  }
  $<HTMLInputElement>("edit-text").value = m.text ?? "";
  $<HTMLInputElement>("edit-caption").value = m.caption ?? "";
  editingVersion = m.version;
  $("edit-form").hidden = false;
  editNote("");
  $("edit-text").focus();
}

/** Shows `m` as the engine has it now (its row and, when open, its view). */
function shown(m: Moment): void {
  if (offFeed?.id === m.id) offFeed = m;
  if (!moments.has(m.id)) {
    if (openMoment === m.id) renderMoment();
    return;
  }
  moments.set(m.id, m);
  document.querySelector(`#feed [data-moment-id="${m.id}"]`)?.replaceWith(momentRow(m));
  if (openMoment === m.id) renderMoment();
}

/** Saves the edit (`PATCH` with `If-Match`; needs the engine: an edit is not kept in the outbox). */
async function saveEdit(): Promise<void> {
  const m = current();
  if (!m) return;
  const text = $<HTMLInputElement>("edit-text").value.trim() || null;
  const caption = $<HTMLInputElement>("edit-caption").value.trim() || null;
  let answer: Response;
  try {
    answer = await client.request("PATCH", `/api/moments/${m.id}`, { text, caption }, ifMatch(editingVersion ?? m.version));
  } catch {
    editNote("Not saved: the engine did not answer (edits are not kept on this device). Try again.", true);
    return;
  }
  const body = await answer.json().catch(() => null);
  if (answer.ok) {
    if (body?.moment) shown(body.moment as Moment);
    $("edit-form").hidden = true;
    editNote("Saved.");
  } else if (answer.status === 412) {
    // The moment as it is now above; what was typed stays in the form,
    // to be saved again (on the new version) or cancelled.
    await refreshMoment(m.id);
    editingVersion = current()?.version ?? editingVersion;
    $<HTMLInputElement>("edit-text").value = text ?? "";
    $<HTMLInputElement>("edit-caption").value = caption ?? "";
    $("edit-form").hidden = false;
    editNote("Not saved: the moment was changed elsewhere meanwhile. It is shown above as it is now; what you typed is kept here: save it again to replace that, or cancel.", true);
  } else {
    editNote(`Not saved: ${body?.detail ?? `HTTP ${answer.status}`}`, true);
  }
}

/**
 * A moment deleted (here, in another tab, on another device): it leaves the
 * feed, this device forgets what it kept of it and the messages still to
 * send to its thread (SPEC section 13; a deleted moment takes none), and,
 * when it is open, its view says so instead of showing it.
 */
function momentGone(id: string): void {
  deletedMoments.add(id);
  moments.delete(id);
  if (offFeed?.id === id) offFeed = null;
  void client.outbox.forgetMoment(id, { unsent: true }).then(renderOutbox).catch(() => undefined);
  document.querySelector(`#feed [data-moment-id="${id}"]`)?.remove();
  if (openMoment === id) {
    $("view-moment").dataset.deleted = "true";
    $("edit-form").hidden = true;
    $("moment").replaceChildren(
      el("h2", { tabIndex: -1 }, "Deleted"),
      el("p", { id: "moment-deleted" }, "This moment was deleted (on this device or another)."),
      el("button", { type: "button", onclick: () => backToFeed() }, "Back to the moments"),
    );
  }
}

/** Moments this page heard were deleted: a message to one refused meanwhile (sent as the deletion came) goes too. */
const deletedMoments = new Set<string>();

/** A message's refusal in words: one refused because its moment is deleted says so plainly (not the engine's text with the id). */
function messageError(r: MessageRecord): string {
  if (r.error?.code === "deleted") return "Not sent: its moment was deleted (on this device or another).";
  return r.error?.detail ?? "The engine refused it.";
}

/** Deletes the moment (`DELETE` with `If-Match`) after asking. */
async function deleteMoment(): Promise<void> {
  const m = current();
  if (!m) return;
  if (engineAway()) {
    editNote(needsEngine("Deleting"), true);
    return;
  }
  if (!confirm("Delete this moment with its photos, reading and thread? This cannot be undone.")) return;
  let answer: Response;
  try {
    answer = await client.request("DELETE", `/api/moments/${m.id}`, undefined, ifMatch(m.version));
  } catch {
    editNote("Not deleted: the engine did not answer. Try again.", true);
    return;
  }
  if (answer.ok) {
    deletedMoments.add(m.id);
    moments.delete(m.id);
    void client.outbox.forgetMoment(m.id, { unsent: true }).then(renderOutbox).catch(() => undefined);
    document.querySelector(`#feed [data-moment-id="${m.id}"]`)?.remove();
    backToFeed();
    flash("The moment was deleted.");
  } else if (answer.status === 412) {
    await refreshMoment(m.id);
    editNote("Not deleted: the moment was changed elsewhere meanwhile. It is shown as it is now; delete it again if you still want to.", true);
  } else {
    const body = await answer.json().catch(() => null);
    editNote(`Not deleted: ${body?.detail ?? `HTTP ${answer.status}`}`, true);
  }
}

async function renderThread(): Promise<void> {
  const id = openMoment;
  if (!id) return;
  let served: Message[] = [];
  try {
    let after: string | null = null;
    do {
      const page: components["schemas"]["MessagePage"] = await api(`/api/messages?thread=${id}${after ? `&after=${after}` : ""}`);
      served.push(...page.messages);
      after = page.next;
    } while (after);
    servedThreads.set(id, served);
  } catch {
    // Offline: the thread as last read, with the outbox's messages.
    served = servedThreads.get(id) ?? [];
  }
  const local = (await client.outbox.messages()).filter((r) => r.thread_id === id);
  const byId = new Map<string, { body: string; ts: string; state: string; record?: MessageRecord }>();
  // An erased thread's bodies are null (SPEC section 13): shown as erased.
  for (const m of served) byId.set(m.id, { body: m.body ?? "(erased)", ts: m.ts, state: "sent" });
  for (const r of local) if (r.state !== "sent" || !byId.has(r.id)) byId.set(r.id, { body: r.body, ts: r.ts, state: r.state, record: r });
  if (openMoment !== id) return;
  // Outgoing messages keep their place: sent ones by id, then the outbox's in its order.
  const rows = [...byId.entries()].sort(([a, x], [b, y]) => (x.record?.order ?? 0) - (y.record?.order ?? 0) || (a < b ? -1 : 1));
  $("thread").replaceChildren(
    ...rows.map(([mid, m]) =>
      el("li", { "data-message-id": mid, "data-state": m.state },
        el("div", {}, m.body, m.state !== "sent" ? el("span", { className: `badge ${m.state}` }, m.state) : null),
        el("div", { className: "meta" }, new Date(m.ts).toLocaleTimeString(), m.record?.error ? ` · ${messageError(m.record)}` : ""),
        m.state === "failed" ? el("button", { onclick: () => void client.retryMessage(mid) }, "Retry") : null,
      ),
    ),
  );
}

// ---- recall and phrases -------------------------------------------------

async function renderPhrases(): Promise<void> {
  const page = await api<components["schemas"]["MarkPage"]>("/api/phrases");
  $("phrases").replaceChildren(
    ...page.marks.map((mark: Mark) =>
      el("li", { "data-mark-id": mark.id }, el("span", {}, mark.phrase), el("button", { onclick: async () => { await post("DELETE", `/api/phrases/${encodeURIComponent(mark.id)}`); void renderPhrases(); } }, "Drop")),
    ),
  );
  if (!page.marks.length) $("phrases").append(el("li", { className: "muted" }, "Keep phrases from a moment to practise them here."));
}

async function startRecall(): Promise<void> {
  const out = $("recall-out");
  out.textContent = "Pippa is preparing a recall…";
  const answer = await post("POST", "/api/recall", { id: mintRequestId(client.clock) });
  const body = await answer.json();
  if (!answer.ok) {
    out.textContent = `Not started: ${body.detail ?? answer.status}`;
    return;
  }
  let turn: Turn = body.recall.turn;
  while (turn.status === "running") turn = await api<Turn>(`/api/turns/${turn.id}?wait=20`);
  out.dataset.status = turn.status;
  out.textContent = turn.status === "done" ? turn.answer ?? "" : `The recall failed: ${turn.error ?? ""}`;
}

// ---- the log ------------------------------------------------------------

async function renderHead(): Promise<void> {
  const head = await api<LogHead>("/api/log/head");
  $("head").replaceChildren(
    el("dt", {}, "seq"), el("dd", { id: "head-seq" }, String(head.seq)),
    el("dt", {}, "segment"), el("dd", {}, head.segment),
    el("dt", {}, "chain"), el("dd", { id: "head-chain" }, head.chain),
  );
}

function renderTail(notice: ChangeNotice): void {
  tail.unshift(notice);
  tail.length = Math.min(tail.length, 100);
  const li = el("li", { "data-seq": notice.seq }, `#${notice.seq} ${notice.kind} ${notice.upserted.join(" ")}${notice.removed.length ? ` −${notice.removed.join(" ")}` : ""}`);
  const list = $("tail");
  list.prepend(li);
  while (list.children.length > 100) list.lastElementChild!.remove();
}

// ---- events -------------------------------------------------------------

function onChange(notice: ChangeNotice): void {
  renderTail(notice);
  if (!$("view-log").hidden) void renderHead();
  const [first, second] = notice.upserted;
  switch (notice.kind) {
    case "moment.create":
    case "moment.edit":
      void refreshMoment(first).then(renderOutbox);
      break;
    case "moment.delete":
      for (const id of notice.removed) momentGone(id);
      break;
    case "media.put":
    case "turn.start":
      void refreshMoment(second);
      break;
    case "turn.finish":
    case "turn.fail":
      // Only turns of moments shown (their turn ids are known).
      if (turnMoment.has(first)) void refreshTurn(first);
      break;
    case "message.post":
      if (openMoment === second) void renderThread();
      break;
    case "mark.keep":
    case "mark.drop":
      if (!$("view-recall").hidden) void renderPhrases();
      break;
  }
}

// ---- capture ------------------------------------------------------------

/** The photos chosen for the next Save, in photo order, each with its preview's object URL. */
let chosen: { file: File; url: string }[] = [];
/** The checks of files being chosen (a Save waits for them). */
let checking: Promise<void> = Promise.resolve();

/** Whether the browser can decode `file` as an image: null when it can, else why not. */
async function unreadable(file: File): Promise<string | null> {
  if (file.type && !file.type.startsWith("image/")) return `“${file.name}” is not a photo (${file.type})`;
  try {
    const bitmap = await createImageBitmap(file);
    bitmap.close();
    return null;
  } catch {
    return `“${file.name}” could not be read as a photo (damaged, or a format this browser cannot show)`;
  }
}

/** Removes chosen photo `i` and keeps the keyboard in the strip: the next photo's Remove, else the one before, else "Choose photos". */
function removeChosen(i: number): void {
  const [gone] = chosen.splice(i, 1);
  if (gone) URL.revokeObjectURL(gone.url);
  renderChosen();
  $("capture-error").textContent = "";
  const buttons = $("capture-preview").querySelectorAll<HTMLButtonElement>("button.remove");
  (buttons[Math.min(i, buttons.length - 1)] ?? $("capture-pick")).focus();
}

/** The preview strip: each chosen photo in the order it is saved in, with its number and a Remove button. */
function renderChosen(): void {
  const n = chosen.length;
  $("capture-preview").replaceChildren(
    ...chosen.map((c, i) =>
      el("li", { "data-photo": i },
        el("img", { src: c.url, alt: `photo ${i + 1} of ${n}: ${c.file.name}` }),
        n > 1 ? el("span", { className: "number", "aria-hidden": "true" }, String(i + 1)) : null,
        el("button", { type: "button", className: "remove", "aria-label": `Remove photo ${i + 1} (${c.file.name})`, disabled: saving, onclick: () => removeChosen(i) }, "×"),
      ),
    ),
  );
  $("capture-form").dataset.photos = String(n);
  const several = $("capture-several");
  several.hidden = n < 2;
  several.textContent = n >= MAX_PHOTOS
    ? `${n} photos: the most one moment holds. They are saved as one moment, in this order.`
    : `${n} photos, saved as one moment in this order (up to ${MAX_PHOTOS}).`;
  $<HTMLButtonElement>("capture-save").textContent = saving ? "Saving…" : n > 1 ? `Save ${n} photos` : "Save";
  // While a Save is stored the form keeps its photos and text (photos
  // chosen meanwhile join the strip for the next Save).
  $("capture-form").dataset.saving = String(saving);
  for (const id of ["capture-save", "capture-clear"]) $<HTMLButtonElement>(id).disabled = saving;
  $<HTMLInputElement>("capture-text").readOnly = saving;
  const note = $("capture-saving");
  note.hidden = !saving;
  note.textContent = saving ? "Saving… being stored on this device. Keep this page open until it says Saved." : "";
}

/** Whether a Save is being stored (until `client.capture` resolves). */
let saving = false;

/** While a Save is being stored, leaving the page asks first: closed now, the capture would be lost. */
function guardUnload(e: BeforeUnloadEvent): void {
  e.preventDefault();
  e.returnValue = "";
}

/**
 * Takes the files of a file input: readable photos join the strip, up to
 * MAX_PHOTOS; a bad file, or one over the limit, is refused with its name
 * and why, and what was typed and the photos already chosen stay. Nothing
 * is stored.
 */
function choose(input: HTMLInputElement): void {
  const files = [...(input.files ?? [])];
  input.value = "";
  $("capture-error").textContent = "";
  checking = checking.then(async () => {
    const refused: string[] = [];
    const over: string[] = [];
    for (const file of files) {
      const why = await unreadable(file);
      if (why) refused.push(why);
      else if (chosen.length >= MAX_PHOTOS) over.push(`“${file.name}”`);
      else chosen.push({ file, url: URL.createObjectURL(file) });
    }
    renderChosen();
    if (over.length) refused.push(`${over.join(", ")}: a moment holds at most ${MAX_PHOTOS} photos, and ${MAX_PHOTOS} are chosen (remove one to add another)`);
    if (refused.length) $("capture-error").textContent = `Not added: ${refused.join("; ")}. What you typed and the photos chosen are kept.`;
  });
}

/** Save: the chosen photos (1 to MAX_PHOTOS, in the strip's order) and the typed text become one capture in the outbox (and are sent from there). */
async function save(): Promise<void> {
  if (saving) return;
  await checking;
  const text = $<HTMLInputElement>("capture-text");
  if (!chosen.length) {
    $("capture-error").textContent = "Take or choose a photo first. What you typed is kept.";
    return;
  }
  if (chosen.length > MAX_PHOTOS) {
    $("capture-error").textContent = `Not saved: a moment holds at most ${MAX_PHOTOS} photos, and ${chosen.length} are chosen. Remove ${chosen.length - MAX_PHOTOS}; what you typed is kept.`;
    return;
  }
  // The form keeps the photos and the text, "Saving…", until the capture
  // is stored (the copies made, hashed and written: a second or more for
  // big photos); leaving the page meanwhile asks first. Only then is the
  // form cleared.
  // A copy: photos chosen while this one is stored join `chosen`, not it.
  const photos = [...chosen];
  const caption = text.value.trim() || null;
  saving = true;
  window.addEventListener("beforeunload", guardUnload);
  renderChosen();
  $("capture-error").textContent = "";
  forgetLastSave();
  renderUndo();
  try {
    const entry = await client.capture({ photos: photos.map((p) => ({ photo: p.file })), text: caption });
    chosen = chosen.filter((c) => !photos.includes(c));
    if (text.value.trim() === (caption ?? "")) text.value = "";
    lastSave = { entry: entry.id, photos, text: caption };
    undoNote = "";
  } catch (e) {
    // Nothing was stored: the photos and the text are still in the form.
    $("capture-error").textContent = `Not saved: ${e instanceof Error ? e.message : String(e)}. The photos and what you typed are kept.`;
  } finally {
    saving = false;
    window.removeEventListener("beforeunload", guardUnload);
    renderChosen();
  }
  await renderOutbox();
}

// ---- undo of the last Save ------------------------------------------------

/** A photo of the last Save, to give back on an undo. */
interface SavedPhoto {
  file: File;
  url: string;
}
/** The last Save (until the next): its one outbox entry, which may be undone while the engine has none of it, with its photos and text. */
let lastSave: { entry: string; photos: SavedPhoto[]; text: string | null } | null = null;
/** An undo in progress. */
let undoing = false;

/** Drops the last Save (its previews' URLs too; those given back by an undo are the form's now). */
function forgetLastSave(): void {
  for (const p of lastSave?.photos ?? []) URL.revokeObjectURL(p.url);
  lastSave = null;
}

/**
 * Whether the engine has acknowledged nothing of the last Save: still in
 * the outbox, its moment's create not done, and the moment not in the
 * feed (a create whose answer was lost shows there once the event stream
 * tells).
 */
function undoable(): boolean {
  const e = lastSave && outboxEntries.find((x) => x.id === lastSave!.entry);
  return Boolean(e && e.state !== "done" && !e.done.includes("create_moment") && !moments.has(e.moment_id));
}

/** What the last undo did, in words, for a while ("" when nothing to say). */
let undoNote = "";

/** The undo bar under Save: offered while the last Save is not acknowledged; says what an undo did. */
function renderUndo(): void {
  // Derived from the outbox as last read (a read that overlapped the Save
  // may lack its entry: the next one puts the bar right); the last Save
  // itself is kept until the next Save.
  const open = undoable();
  $("undo-save").hidden = !open || undoing;
  let text = undoNote;
  if (undoing) text = "Undoing…";
  else if (open && lastSave) {
    const sending = client.sendState.sending?.entry === lastSave.entry;
    const n = lastSave.photos.length;
    text = `Saved ${n === 1 ? "a capture" : `a capture of ${n} photos`} on this device; ${sending ? "sending now" : "not sent yet"}.`;
  }
  $("undo-text").textContent = text;
  $("undo").hidden = !text;
}

/** What undoing a capture did, in words. */
function withdrawWords(outcomes: WithdrawOutcome[], photos = 1): string {
  const count = (o: WithdrawOutcome) => outcomes.filter((x) => x === o).length;
  const parts: string[] = [];
  const undone = count("undone") + count("gone");
  const what = photos > 1 ? `the capture of ${photos} photos was` : "the capture was";
  if (undone) parts.push(`Undone: ${undone === 1 ? what : `${undone} captures were`} removed from this device; the engine has none of it.`);
  if (count("acknowledged")) parts.push(`Too late for ${count("acknowledged") === 1 ? "one" : count("acknowledged")}: the engine already has it, so it stays (delete it from its moment).`);
  if (count("unknown")) parts.push("Not undone: the connection dropped while it was being sent and the engine cannot be asked now whether it got it. Try again when the engine answers.");
  return parts.join(" ");
}

/**
 * Undo of the last Save while the engine has none of it: its capture
 * leaves the outbox with every photo's bytes (`withdrawEntry`, which waits
 * for a request of it in flight); the photos and the text come back into
 * the form. One the engine has stays, and the bar says so.
 */
async function undoSave(): Promise<void> {
  const save = lastSave;
  if (!save || !undoable() || undoing) return;
  undoing = true;
  undoNote = "";
  renderUndo();
  const outcome = await client.withdrawEntry(save.entry);
  undoing = false;
  const back = outcome === "undone";
  if (back) {
    // Back into the form, to change or clear; their previews are kept.
    lastSave = null;
    chosen = [...save.photos, ...chosen];
    const text = $<HTMLInputElement>("capture-text");
    if (!text.value && save.text) text.value = save.text;
    renderChosen();
  }
  const note = `${withdrawWords([outcome], save.photos.length)}${back ? ` The ${save.photos.length === 1 ? "photo is" : "photos are"} back above.` : ""}`;
  undoNote = note;
  await renderOutbox();
  setTimeout(() => {
    if (undoNote === note) undoNote = "";
    renderUndo();
  }, 10_000);
}

// ---- start --------------------------------------------------------------

/** Loads what needs the engine (sign-in, then the feed), trying again with backoff until it works; the status says what happens meanwhile. */
async function connect(): Promise<void> {
  for (let attempt = 1; ; attempt += 1) {
    try {
      if (!(await signedIn())) {
        loadTrouble = null;
        await signIn("This engine needs a token.");
        continue;
      }
      await loadFeed();
      loadTrouble = null;
      await renderOutbox();
      void setStatus();
      return;
    } catch (e) {
      const delay = Math.min(30_000, 1000 * 2 ** (attempt - 1));
      const message = e instanceof Error ? e.message : String(e);
      const status = /^(\d{3})\b/.exec(message)?.[1];
      loadTrouble = { reason: status ? `HTTP ${status}` : "no answer", retryAt: Date.now() + delay };
      document.body.dataset.load = "retrying";
      await new Promise<void>((resolve) => {
        const tick = setInterval(() => void setStatus(), 1000);
        const done = () => {
          clearInterval(tick);
          clearTimeout(timer);
          window.removeEventListener("online", done);
          resolve();
        };
        const timer = setTimeout(done, delay);
        window.addEventListener("online", done);
        void setStatus();
      });
    }
  }
}

async function main(): Promise<void> {
  // A moment's URL (`#/moments/<id>`) opens it once it can be read.
  const start = hashMoment();
  startAppShell();
  // This device's outbox first: it needs no engine.
  client = await SparkClient.open();
  client.addEventListener("change", (e) => onChange((e as CustomEvent<ChangeNotice>).detail));
  // The server's log is another history than the stream followed (a
  // restore and a take-over, a failover): what the changes built may hold
  // ops it does not have. Load it all again.
  client.addEventListener("resync", () => {
    void loadFeed().catch(() => undefined);
    if (openMoment) void renderThread();
  });
  client.addEventListener("outbox", () => {
    void renderOutbox();
    void setStatus();
    if (openMoment) void renderThread();
  });
  for (const name of ["sender", "status"]) client.addEventListener(name, () => void setStatus());
  // A session that expired or was ended: the sender's requests answer 401
  // (they wait, as SPEC section 6 says); ask for the token again, then go on.
  client.addEventListener("status", async () => {
    if (client.lastWait?.status !== 401 || signing) return;
    const inside = await signedIn().catch(() => true);
    if (inside || signing) return;
    await signIn("Your session ended: sign in again to go on.");
    await afterSignIn();
  });
  window.addEventListener("online", () => void setStatus());
  window.addEventListener("offline", () => void setStatus());

  // The main navigation (Moments, Recall) and, at the foot, the engine's log: a view for whoever runs the engine, not a place people go.
  for (const b of document.querySelectorAll<HTMLButtonElement>("button[data-view]")) b.onclick = () => (b.dataset.view === "moments" && !$("view-moment").hidden ? backToFeed() : show(b.dataset.view as "moments"));
  $("back").onclick = () => backToFeed();
  // Back and Forward (Android's Back too): the moment of the URL, or the feed.
  window.addEventListener("popstate", () => {
    const id = hashMoment();
    if (id) {
      if (openMoment !== id) void openMomentView(id, "none");
    } else if (!$("view-moment").hidden) {
      showFeed();
    }
  });
  // Escape in a moment: back to the feed (in its edit form: the form closes).
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Escape" || $("view-moment").hidden || e.defaultPrevented) return;
    if ((e.target as Element | null)?.closest?.("#edit-form") && !$("edit-form").hidden) {
      $("edit-form").hidden = true;
      $("edit-open").focus();
      return;
    }
    backToFeed();
  });
  $("signout").onclick = () => void signOut();
  for (const id of ["capture-file", "capture-pick"]) $<HTMLInputElement>(id).onchange = (e) => choose(e.target as HTMLInputElement);
  $("capture-form").onsubmit = (e) => {
    e.preventDefault();
    void save();
  };
  $("capture-clear").onclick = () => {
    for (const c of chosen) URL.revokeObjectURL(c.url);
    chosen = [];
    renderChosen();
    $("capture-error").textContent = "";
  };
  $("message-form").onsubmit = async (e) => {
    e.preventDefault();
    const input = $<HTMLInputElement>("message-body");
    const body = input.value;
    input.value = "";
    if (openMoment && body.trim()) await client.sendMessage(openMoment, body);
  };
  $("keep-form").onsubmit = async (e) => {
    e.preventDefault();
    const input = $<HTMLInputElement>("keep-phrase");
    const note = $("keep-status");
    const phrase = input.value;
    if (engineAway()) {
      note.className = "error";
      note.textContent = needsEngine("Keeping a phrase");
      return;
    }
    note.className = "muted";
    note.textContent = "Keeping…";
    let answer: Response;
    try {
      answer = await post("POST", "/api/phrases", { phrase, moment_id: openMoment });
    } catch {
      note.className = "error";
      note.textContent = "Not kept: the engine did not answer. Try again.";
      return;
    }
    if (answer.ok) {
      if (input.value === phrase) input.value = "";
      note.textContent = `Kept “${phrase.trim()}”.`;
    } else {
      const problem = await answer.json().catch(() => ({}));
      note.className = "error";
      note.textContent = `Not kept: ${problem.detail ?? `HTTP ${answer.status}`}`;
    }
  };
  $("recall-start").onclick = () => void startRecall();
  $("edit-open").onclick = () => openEdit();
  $("edit-cancel").onclick = () => ($("edit-form").hidden = true);
  $("edit-form").onsubmit = (e) => {
    e.preventDefault();
    void saveEdit();
  };
  $("delete-moment").onclick = () => void deleteMoment();
  $("read-again").onclick = () => void readAgain();
  $("undo-save").onclick = () => void undoSave();
  $("feed-more").onclick = () => void loadMore();
  // The end of the feed scrolled near: the next page, as the button would.
  new IntersectionObserver((seen) => {
    if (seen.some((s) => s.isIntersecting) && !$("view-moments").hidden) void loadMore();
  }, { rootMargin: "0px 0px 600px 0px" }).observe($("feed-more"));

  show("moments");
  // The feed as last seen, until the engine answers (offline.ts).
  const feedView = { feed: $("feed"), empty: $("feed-empty"), moments, turns, row: momentRow };
  await restoreLastSeen(feedView);
  followLastSeen(feedView);
  await renderOutbox();
  await setStatus();
  const early = Boolean(start && moments.has(start));
  if (early) await openMomentView(start!, "replace");
  await connect();
  // Not in the feed as last seen: once the engine answers (unless another view was chosen meanwhile).
  if (start && !early && openedFrom === null && !$("view-moments").hidden) await openMomentView(start, "replace");
  await probeTokens();
  document.body.dataset.ready = "true";
  document.body.dataset.load = "done";
}

void main();
