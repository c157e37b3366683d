// How the client takes an answer, or its absence (SPEC section 6), as the
// Rust client does (client/src/answers.rs):
//
// | answer                            | what happens                                        |
// | 2xx                               | done: the step is marked, skipped on every later pass |
// | 401, 403, 408, 425, 429           | passing trouble: wait like a dropped link, for Retry-After when sent |
// | any other 4xx                     | park the entry with its reason, for the person to see |
// | 5xx, a network error, a timeout   | wait with exponential backoff and jitter (Retry-After when sent) |

/** The problem+json body of an error answer (SPEC section 10). */
export interface Problem {
  type?: string;
  title?: string;
  status?: number;
  detail?: string;
  code?: string;
  [member: string]: unknown;
}

/** Why a send is waiting. */
export interface WaitCause {
  kind: "link" | "passing" | "server";
  /** The status, when there was an answer. */
  status?: number;
  /** The parsed Retry-After, in ms. */
  retryAfterMs?: number;
  /** In words. */
  reason: string;
}

/** A refusal for good. */
export interface Refusal {
  status: number;
  code?: string;
  detail: string;
  body: Problem | null;
}

/** How one answer (or its absence) is taken. */
export type Verdict =
  | { kind: "done"; response: Response; body: unknown }
  | { kind: "wait"; cause: WaitCause }
  | { kind: "refused"; refusal: Refusal };

/** The class of a status code (SPEC section 6). */
export function statusClass(status: number): "done" | "passing" | "server" | "permanent" {
  if (status >= 200 && status <= 299) return "done";
  if ([401, 403, 408, 425, 429].includes(status)) return "passing";
  if (status >= 500 && status <= 599) return "server";
  return "permanent";
}

/** Parses Retry-After: delta-seconds or an HTTP date (against `nowMs`; a past date is no wait). In ms. */
export function parseRetryAfter(value: string | null, nowMs: number): number | undefined {
  if (value == null) return undefined;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const at = Date.parse(text);
  if (Number.isNaN(at)) return undefined;
  return Math.max(0, at - nowMs);
}

async function readBody(response: Response): Promise<{ json: unknown; text: string }> {
  const text = await response.text().catch(() => "");
  try {
    return { json: text ? JSON.parse(text) : null, text };
  } catch {
    return { json: null, text };
  }
}

/** Takes the result of one fetch (a Response, or the error it threw) per SPEC section 6. */
export async function classify(result: Response | Error, nowMs: number): Promise<Verdict> {
  if (result instanceof Error) {
    return { kind: "wait", cause: { kind: "link", reason: `network: ${result.message}` } };
  }
  const response = result;
  const { json, text } = await readBody(response);
  const klass = statusClass(response.status);
  if (klass === "done") return { kind: "done", response, body: json };
  const problem = (json && typeof json === "object" ? json : null) as Problem | null;
  const detail = problem?.detail || problem?.title || text.slice(0, 200) || "no details";
  const reason = `HTTP ${response.status} ${problem?.code ?? ""} ${detail}`.replace(/\s+/g, " ").trim();
  const retryAfterMs = parseRetryAfter(response.headers.get("retry-after"), nowMs);
  if (klass === "passing") return { kind: "wait", cause: { kind: "passing", status: response.status, retryAfterMs, reason } };
  if (klass === "server") return { kind: "wait", cause: { kind: "server", status: response.status, retryAfterMs, reason } };
  return { kind: "refused", refusal: { status: response.status, code: problem?.code, detail, body: problem } };
}

/** Backoff settings, in ms. */
export interface Backoff {
  baseMs: number;
  maxMs: number;
  /** The longest Retry-After honoured; a longer one is cut to this. */
  retryAfterMaxMs: number;
}

/** 0.5 s doubling to 60 s, Retry-After honoured up to an hour (as the Rust client). */
export const DEFAULT_BACKOFF: Backoff = { baseMs: 500, maxMs: 60_000, retryAfterMaxMs: 3_600_000 };

/**
 * How long to wait after the `waitsInARow`-th wait (from 1): Retry-After
 * when the answer sent one, else exponential backoff with full jitter in
 * its upper half ([d/2, d]) so that many tabs or phones do not retry in step.
 */
export function backoffDelay(cause: WaitCause, waitsInARow: number, backoff: Backoff = DEFAULT_BACKOFF, random: () => number = Math.random): number {
  if (cause.retryAfterMs !== undefined) return Math.min(cause.retryAfterMs, backoff.retryAfterMaxMs);
  const exp = Math.min(backoff.maxMs, backoff.baseMs * 2 ** Math.max(0, waitsInARow - 1));
  return Math.round(exp / 2 + random() * (exp / 2));
}
