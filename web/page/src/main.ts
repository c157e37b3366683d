// The engine's page (SPEC section 12): the moments feed,
// live over the event stream through the client package (a change
// re-renders one row, not the list), capture from a file or the camera, a
// moment with its copy, Pippa's reading as it arrives, keeping phrases,
// quick recall, the message thread with pending and failed messages and a
// retry, and a log view with the head, the chain value and a live tail.
//
// The page works without the engine as far as it can: the outbox is read
// from this device before any request, a failed load is tried again with
// backoff (the status says so), and the status says whether the engine
// answers ("Online", "Reconnecting…", "Offline"), never a raw HTTP line.
import { SparkClient, mintRequestId, type ChangeNotice, type Entry, type MessageRecord, type Step, type components } from "../../client/src/index.js";
import { followLastSeen, restoreLastSeen } from "./offline.js";
import { startAppShell } from "./shell.js";

type Moment = components["schemas"]["Moment"];
type Turn = components["schemas"]["Turn"];
type Message = components["schemas"]["Message"];
type Mark = components["schemas"]["Mark"];
type LogHead = components["schemas"]["LogHead"];

const $ = <T extends HTMLElement = HTMLElement>(id: string) => document.getElementById(id) as T;

function el<K extends keyof HTMLElementTagNameMap>(tag: K, props: Partial<HTMLElementTagNameMap[K]> & Record<string, unknown> = {}, ...children: (Node | string | null)[]): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k.startsWith("data-")) node.setAttribute(k, String(v));
    else (node as unknown as Record<string, unknown>)[k] = v;
  }
  for (const c of children) if (c !== null) node.append(c);
  return node;
}

let client: SparkClient;
/** Moments shown, by id. */
const moments = new Map<string, Moment>();
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

/** Whether the engine lets us in: with tokens configured and no session, it says 401. Throws when it does not answer. */
async function signedIn(): Promise<boolean> {
  const answer = await fetch("/api/log/head", { credentials: "include", cache: "no-store", headers: { "X-Spark-Client": "web" } });
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
  void waitingWords().then((w) => ($("signin-waiting").textContent = w ? `${w} wait on this device; they are sent once you are signed in.` : ""));
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
  for (const b of document.querySelectorAll<HTMLButtonElement>("nav button")) {
    if (b.dataset.view === view || (view === "moment" && b.dataset.view === "moments")) b.setAttribute("aria-current", "page");
    else b.removeAttribute("aria-current");
  }
  if (view !== "moment") openMoment = null;
  if (view === "recall") void renderPhrases();
  if (view === "log") void renderHead();
}

/** Set while the first load (or a load after a sign-in) fails: why, and when it is tried again (ms since the epoch). */
let loadTrouble: { reason: string; retryAt: number } | null = null;

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
    const messages = (await client.outbox.messages()).filter((m) => m.state === "pending");
    const waiting = entries.filter((e) => e.state === "pending").length + messages.length;
    const parked = entries.filter((e) => e.state === "parked").length;
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
  if (reason.startsWith("network")) return "Waiting for the connection to the engine.";
  const status = Number(/^HTTP (\d{3})/.exec(reason)?.[1] ?? 0);
  if (status === 401) return "Waiting for you to sign in.";
  if (status === 403) return "Waiting: the engine refused access for now.";
  if (status === 429) return "Waiting: the engine is busy.";
  if (status >= 500) return `Waiting: the engine has trouble (HTTP ${status}).`;
  return "Waiting to be sent.";
}

// ---- the feed -----------------------------------------------------------

function copyUrl(m: Moment): string | null {
  const copy = m.media.find((x) => x.role === "copy");
  return copy ? `/api/media/${copy.id}` : null;
}

function reading(m: Moment): Turn | undefined {
  return m.turns.map((t) => turns.get(t)).find((t): t is Turn => t !== undefined && t.mode === "practical");
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
    "data-moment-id": m.id, "data-version": m.version, "data-reading": t?.status ?? "none", tabIndex: 0, role: "link",
    onclick: () => void openMomentView(m.id),
    onkeydown: (e: KeyboardEvent) => {
      if (e.key === "Enter" || e.key === " ") {
        e.preventDefault();
        void openMomentView(m.id);
      }
    },
  },
    url ? el("img", { src: url, alt: "", loading: "lazy" }) : el("div", { className: "thumb" }),
    el("div", {},
      el("div", { className: "title" }, m.text || m.caption || "A sign"),
      el("div", { className: "snippet" }, readingText(t)),
      el("div", { className: "muted" }, new Date(m.created_at).toLocaleString()),
    ),
  );
  return row;
}

const STEP_WORDS: Record<Step, string> = { create_moment: "the moment", upload_copy: "the small copy", start_turn: "the reading", upload_original: "the original photo" };

/** Object URLs of waiting captures' copies, by entry id. */
const thumbs = new Map<string, string>();

async function thumbUrl(e: Entry): Promise<string | null> {
  if (thumbs.has(e.id)) return thumbs.get(e.id)!;
  const bytes = await client.outbox.bytes(e.id, "copy").catch(() => undefined);
  if (!bytes) return null;
  const url = URL.createObjectURL(new Blob([bytes], { type: e.copy.content_type }));
  thumbs.set(e.id, url);
  return url;
}

function entryRow(e: Entry, thumb: string | null): HTMLLIElement {
  const state = e.state === "parked" ? "parked" : "pending";
  let detail: string;
  if (e.parked) {
    const made = e.done.includes("create_moment") ? "The moment is saved, but the engine refused " : "The engine refused ";
    detail = `${made}${STEP_WORDS[e.parked.step]}: ${e.parked.detail} (HTTP ${e.parked.status}${e.parked.code ? ` ${e.parked.code}` : ""}).`;
  } else {
    detail = waitWords(e.last_error) || (e.done.length ? `Sending (${e.done.length} of 4 steps done)…` : "Waiting to be sent.");
  }
  const button = (label: string, action: () => Promise<void>) =>
    el("button", { type: "button", onclick: (ev: Event) => { ev.stopPropagation(); void action(); } }, label);
  return el("li", { "data-entry-id": e.id, "data-outbox": state },
    thumb ? el("img", { src: thumb, alt: "" }) : el("div", { className: "thumb" }),
    el("div", {},
      el("div", { className: "title" }, e.text || "A sign", el("span", { className: `badge ${state}` }, state === "parked" ? "not sent" : "waiting")),
      el("div", { className: "snippet", "data-detail": "" }, detail),
      e.state === "parked"
        ? el("div", { className: "row actions" },
            button("Retry", () => client.retryEntry(e.id)),
            button("Remove", async () => {
              if (!confirm(e.done.includes("create_moment") ? "Remove what is left of this capture from this device? The moment stays." : "Remove this capture from this device? It was not sent.")) return;
              await client.removeEntry(e.id);
            }),
          )
        : null,
    ),
  );
}

/** Fetches one moment and its turns, and re-renders its row (and the open view) only. */
async function refreshMoment(id: string): Promise<void> {
  let m: Moment;
  try {
    m = await api<Moment>(`/api/moments/${id}`);
  } catch {
    moments.delete(id);
    document.querySelector(`[data-moment-id="${id}"]`)?.remove();
    return;
  }
  await Promise.all(m.turns.map((t) => refreshTurn(t, false)));
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

async function refreshTurn(id: string, rerender = true): Promise<void> {
  const t = await api<Turn>(`/api/turns/${id}`).catch(() => null);
  if (!t) return;
  turns.set(id, t);
  turnMoment.set(id, t.moment_id);
  if (rerender && moments.has(t.moment_id)) {
    const row = document.querySelector(`#feed [data-moment-id="${t.moment_id}"]`);
    row?.replaceWith(momentRow(moments.get(t.moment_id)!));
    if (openMoment === t.moment_id) renderMoment();
  }
}

async function loadFeed(): Promise<void> {
  let after: string | null = null;
  const all: Moment[] = [];
  do {
    const page: components["schemas"]["MomentPage"] = await api(`/api/moments?limit=1000${after ? `&after=${after}` : ""}`);
    all.push(...page.moments);
    after = page.next;
  } while (after);
  await Promise.all(all.flatMap((m) => m.turns.map((t) => refreshTurn(t, false))));
  const feed = $("feed");
  feed.replaceChildren();
  moments.clear();
  for (const m of all.reverse()) {
    moments.set(m.id, m);
    feed.append(momentRow(m));
  }
  $("feed-empty").hidden = moments.size > 0;
}

async function renderOutbox(): Promise<void> {
  const feed = $("feed");
  // Waiting captures until their moment shows; parked ones always (a
  // capture parked after its moment was made still needs the person).
  const shown = (await client.outbox.entries()).filter((e) => e.state === "parked" || (e.state === "pending" && !moments.has(e.moment_id)));
  const rows = await Promise.all(shown.map(async (e) => entryRow(e, await thumbUrl(e))));
  feed.querySelectorAll("[data-entry-id]").forEach((r) => r.remove());
  for (const row of rows.reverse()) feed.prepend(row);
  const live = new Set(shown.map((e) => e.id));
  for (const [id, url] of thumbs) {
    if (!live.has(id)) {
      URL.revokeObjectURL(url);
      thumbs.delete(id);
    }
  }
  $("feed-empty").hidden = moments.size > 0 || shown.length > 0;
}

// ---- one moment ---------------------------------------------------------

async function openMomentView(id: string): Promise<void> {
  openMoment = id;
  show("moment");
  openMoment = id;
  $("keep-status").textContent = "";
  $("edit-form").hidden = true;
  $("edit-status").textContent = "";
  renderMoment();
  $("moment").querySelector<HTMLElement>("h2")?.focus();
  await renderThread();
}

function renderMoment(): void {
  const m = openMoment ? moments.get(openMoment) : undefined;
  if (!m) return;
  const url = copyUrl(m);
  const t = reading(m);
  $("moment").replaceChildren(
    url ? el("img", { src: url, alt: "the copy of the photo" }) : el("div", { className: "thumb" }),
    el("h2", { tabIndex: -1 }, m.text || m.caption || "A sign"),
    el("p", { className: "muted" }, `captured ${m.captured_at ? new Date(m.captured_at).toLocaleString() : "—"} · ${m.media.length} media · version ${m.version}`),
    el("h3", {}, "Pippa's reading"),
    el("div", { className: "reading", id: "moment-reading", "data-status": t?.status ?? "none" }, readingText(t) || "No reading yet."),
  );
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
  const m = openMoment ? moments.get(openMoment) : undefined;
  if (!m) return;
  $<HTMLInputElement>("edit-text").value = m.text ?? "";
  $<HTMLInputElement>("edit-caption").value = m.caption ?? "";
  editingVersion = m.version;
  $("edit-form").hidden = false;
  editNote("");
  $("edit-text").focus();
}

/** Shows `m` as the engine has it now (its row and, when open, its view). */
function shown(m: Moment): void {
  moments.set(m.id, m);
  document.querySelector(`#feed [data-moment-id="${m.id}"]`)?.replaceWith(momentRow(m));
  if (openMoment === m.id) renderMoment();
}

/** Saves the edit (`PATCH` with `If-Match`; needs the engine: an edit is not kept in the outbox). */
async function saveEdit(): Promise<void> {
  const m = openMoment ? moments.get(openMoment) : undefined;
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
    $("edit-form").hidden = true;
    await refreshMoment(m.id);
    editNote("Not saved: the moment was changed elsewhere meanwhile. It is shown as it is now; edit it again.", true);
  } else {
    editNote(`Not saved: ${body?.detail ?? `HTTP ${answer.status}`}`, true);
  }
}

/** Deletes the moment (`DELETE` with `If-Match`) after asking. */
async function deleteMoment(): Promise<void> {
  const m = openMoment ? moments.get(openMoment) : undefined;
  if (!m) return;
  if (!confirm("Delete this moment with its photos, reading and thread? This cannot be undone.")) return;
  let answer: Response;
  try {
    answer = await client.request("DELETE", `/api/moments/${m.id}`, undefined, ifMatch(m.version));
  } catch {
    editNote("Not deleted: the engine did not answer. Try again.", true);
    return;
  }
  if (answer.ok) {
    moments.delete(m.id);
    document.querySelector(`#feed [data-moment-id="${m.id}"]`)?.remove();
    show("moments");
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
        el("div", { className: "meta" }, new Date(m.ts).toLocaleTimeString(), m.record?.error ? ` · ${m.record.error.detail}` : ""),
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
      for (const id of notice.removed) {
        moments.delete(id);
        document.querySelector(`#feed [data-moment-id="${id}"]`)?.remove();
      }
      break;
    case "media.put":
    case "turn.start":
      void refreshMoment(second);
      break;
    case "turn.finish":
    case "turn.fail":
      void refreshTurn(first);
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

/** The photos chosen for the next Save, each with its preview's object URL. */
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

function renderChosen(): void {
  $("capture-preview").replaceChildren(
    ...chosen.map((c, i) =>
      el("li", {},
        el("img", { src: c.url, alt: `photo ${i + 1}: ${c.file.name}` }),
        el("button", { type: "button", className: "remove", "aria-label": `Remove photo ${i + 1}`, onclick: () => { URL.revokeObjectURL(c.url); chosen.splice(i, 1); renderChosen(); } }, "×"),
      ),
    ),
  );
  $("capture-form").dataset.photos = String(chosen.length);
  $<HTMLButtonElement>("capture-save").textContent = chosen.length > 1 ? `Save ${chosen.length} photos` : "Save";
}

/** Takes the files of a file input: readable photos join the preview; a bad file is refused with its reason. Nothing is stored. */
function choose(input: HTMLInputElement): void {
  const files = [...(input.files ?? [])];
  input.value = "";
  $("capture-error").textContent = "";
  checking = checking.then(async () => {
    const refused: string[] = [];
    for (const file of files) {
      const why = await unreadable(file);
      if (why) refused.push(why);
      else chosen.push({ file, url: URL.createObjectURL(file) });
    }
    renderChosen();
    if (refused.length) $("capture-error").textContent = `Not added: ${refused.join("; ")}. What you typed is kept.`;
  });
}

/** Save: each chosen photo becomes one capture with the typed text, stored in the outbox (and sent from there). */
async function save(): Promise<void> {
  await checking;
  const text = $<HTMLInputElement>("capture-text");
  if (!chosen.length) {
    $("capture-error").textContent = "Take or choose a photo first. What you typed is kept.";
    return;
  }
  // Take the photos and the text, and clear both, before the first
  // await: the next capture may be started while this one is stored.
  const photos = chosen;
  const caption = text.value.trim() || null;
  chosen = [];
  text.value = "";
  renderChosen();
  $("capture-error").textContent = "";
  const failed: { file: File; url: string }[] = [];
  for (const photo of photos) {
    try {
      await client.capture({ photo: photo.file, text: caption });
      URL.revokeObjectURL(photo.url);
    } catch (e) {
      failed.push(photo);
      $("capture-error").textContent = `Not saved: ${e instanceof Error ? e.message : String(e)}.`;
    }
  }
  if (failed.length) {
    // Give back what was not stored.
    chosen = [...failed, ...chosen];
    if (!text.value && caption) text.value = caption;
    renderChosen();
  }
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
  startAppShell();
  // This device's outbox first: it needs no engine.
  client = await SparkClient.open();
  client.addEventListener("change", (e) => onChange((e as CustomEvent<ChangeNotice>).detail));
  // The server's log is another history than the stream followed (a
  // restore and a take-over, a failover): what the changes built may hold
  // ops it does not have. Load it all again.
  client.addEventListener("resync", () => {
    moments.clear();
    void loadFeed();
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

  for (const b of document.querySelectorAll<HTMLButtonElement>("nav button")) b.onclick = () => show(b.dataset.view as "moments");
  $("back").onclick = () => show("moments");
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

  show("moments");
  // The feed as last seen, until the engine answers (offline.ts).
  const feedView = { feed: $("feed"), empty: $("feed-empty"), moments, turns, row: momentRow };
  await restoreLastSeen(feedView);
  followLastSeen(feedView);
  await renderOutbox();
  await setStatus();
  await connect();
  await probeTokens();
  document.body.dataset.ready = "true";
  document.body.dataset.load = "done";
}

void main();
