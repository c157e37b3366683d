// The engine's page (SPEC section 12): the moments feed,
// live over the event stream through the client package (a change
// re-renders one row, not the list), capture from a file or the camera, a
// moment with its copy, Pippa's reading as it arrives, keeping phrases,
// quick recall, the message thread with pending and failed messages and a
// retry, and a log view with the head, the chain value and a live tail.
import { SparkClient, mintRequestId, type ChangeNotice, type Entry, type MessageRecord, type components } from "../../client/src/index.js";

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

/** Whether the engine answers us: with tokens configured and no session, it says 401 and the page asks for a token once. */
async function signedIn(): Promise<boolean> {
  const answer = await fetch("/api/log/head", { credentials: "include", headers: { "X-Spark-Client": "web" } });
  return answer.status !== 401;
}

function askForToken(): Promise<void> {
  $("signin").hidden = false;
  return new Promise((resolve) => {
    $("signin-form").onsubmit = async (e) => {
      e.preventDefault();
      const input = $<HTMLInputElement>("signin-token");
      const token = input.value.trim();
      // The token goes once, in a header, and is not kept: the answer
      // sets an HttpOnly session cookie.
      input.value = "";
      const answer = await fetch("/api/session", { method: "POST", credentials: "include", headers: { Authorization: `Bearer ${token}`, "X-Spark-Client": "web" } });
      if (answer.ok) {
        $("signin").hidden = true;
        resolve();
      } else {
        const problem = await answer.json().catch(() => ({}));
        $("signin-error").textContent = `Not signed in: ${problem.detail ?? answer.status}`;
      }
    };
  });
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

async function setStatus(): Promise<void> {
  const entries = (await client.outbox.entries()).filter((e) => e.state !== "done");
  const messages = (await client.outbox.messages()).filter((m) => m.state === "pending");
  const parts = [client.isSender ? "sending tab" : "another tab sends", navigator.onLine ? "online" : "offline"];
  if (entries.length || messages.length) parts.push(`${entries.length + messages.length} waiting`);
  if (client.lastWait) parts.push(client.lastWait.reason);
  $("status").textContent = parts.join(" · ");
  $("status").dataset.sender = String(client.isSender);
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
  const row = el("li", { "data-moment-id": m.id, "data-version": m.version, "data-reading": t?.status ?? "none", onclick: () => void openMomentView(m.id) },
    url ? el("img", { src: url, alt: "", loading: "lazy" }) : el("div", { className: "thumb" }),
    el("div", {},
      el("div", { className: "title" }, m.text || m.caption || "A sign"),
      el("div", { className: "snippet" }, readingText(t)),
      el("div", { className: "muted" }, new Date(m.created_at).toLocaleString()),
    ),
  );
  return row;
}

function entryRow(e: Entry): HTMLLIElement {
  const state = e.state === "parked" ? "parked" : "pending";
  const detail = e.parked ? `${e.parked.status} ${e.parked.code ?? ""}: ${e.parked.detail}` : e.last_error ?? `sending (${e.done.length}/4)`;
  return el("li", { "data-entry-id": e.id, "data-outbox": state },
    el("div", { className: "thumb" }),
    el("div", {},
      el("div", { className: "title" }, e.text || "A sign", el("span", { className: `badge ${state}` }, state)),
      el("div", { className: "snippet" }, detail),
      e.state === "parked" ? el("button", { onclick: (ev: Event) => { ev.stopPropagation(); void client.retryEntry(e.id); } }, "Retry") : null,
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
  for (const m of all.reverse()) {
    moments.set(m.id, m);
    feed.append(momentRow(m));
  }
  $("feed-empty").hidden = moments.size > 0;
}

async function renderOutbox(): Promise<void> {
  const feed = $("feed");
  feed.querySelectorAll("[data-entry-id]").forEach((r) => r.remove());
  const waiting = (await client.outbox.entries()).filter((e) => e.state !== "done" && !moments.has(e.moment_id));
  for (const e of waiting.reverse()) feed.prepend(entryRow(e));
  if (waiting.length) $("feed-empty").hidden = true;
}

// ---- one moment ---------------------------------------------------------

async function openMomentView(id: string): Promise<void> {
  openMoment = id;
  show("moment");
  openMoment = id;
  renderMoment();
  await renderThread();
}

function renderMoment(): void {
  const m = openMoment ? moments.get(openMoment) : undefined;
  if (!m) return;
  const url = copyUrl(m);
  const t = reading(m);
  $("moment").replaceChildren(
    url ? el("img", { src: url, alt: "the copy of the photo" }) : el("div", { className: "thumb" }),
    el("h2", {}, m.text || m.caption || "A sign"),
    el("p", { className: "muted" }, `captured ${m.captured_at ? new Date(m.captured_at).toLocaleString() : "—"} · ${m.media.length} media · version ${m.version}`),
    el("h3", {}, "Pippa's reading"),
    el("div", { className: "reading", id: "moment-reading", "data-status": t?.status ?? "none" }, readingText(t) || "No reading yet."),
  );
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

// ---- start --------------------------------------------------------------

async function main(): Promise<void> {
  if (!(await signedIn())) await askForToken();
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
  let asking = false;
  client.addEventListener("status", async () => {
    if (client.lastWait?.status !== 401 || asking) return;
    asking = true;
    if (!(await signedIn())) await askForToken();
    asking = false;
    client.kick();
  });
  window.addEventListener("online", () => void setStatus());
  window.addEventListener("offline", () => void setStatus());

  for (const b of document.querySelectorAll<HTMLButtonElement>("nav button")) b.onclick = () => show(b.dataset.view as "moments");
  $("back").onclick = () => show("moments");
  $<HTMLInputElement>("capture-file").onchange = async (e) => {
    const input = e.target as HTMLInputElement;
    const text = $<HTMLInputElement>("capture-text");
    // Take the photos and the text, and clear both, before the first
    // await: a person (or a test) may type the next capture's text while
    // this one is stored, and clearing the field afterwards would erase it.
    const photos = [...(input.files ?? [])];
    const caption = text.value.trim() || null;
    input.value = "";
    text.value = "";
    for (const photo of photos) {
      await client.capture({ photo, text: caption });
    }
  };
  $("capture-form").onsubmit = (e) => e.preventDefault();
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
    const answer = await post("POST", "/api/phrases", { phrase: input.value, moment_id: openMoment });
    if (answer.ok) input.value = "";
    input.setCustomValidity(answer.ok ? "" : ((await answer.json()).detail ?? "refused"));
    input.reportValidity();
  };
  $("recall-start").onclick = () => void startRecall();

  show("moments");
  await loadFeed();
  await renderOutbox();
  await setStatus();
  document.body.dataset.ready = "true";
}

void main();
