// Ids minted in the page (SPEC section 2): ULIDs from the `ulid` package's
// monotonic factory, read against the client's clock, and SHA-256 through
// crypto.subtle.
import { decodeTime, monotonicFactory } from "ulid";
import type { Clock } from "./clock.js";

let factory = monotonicFactory();
let lastMs = -Infinity;

/**
 * A new ULID (canonical upper case) whose time is `clock.now()`; ids minted
 * in one millisecond still sort in minting order. When the clock steps back
 * (the person set it), a new monotonic sequence starts there: the `ulid`
 * factory would otherwise keep minting at the old, later time, and a
 * message id must carry the page's clock (ADR-036).
 */
export function mintUlid(clock: Clock): string {
  const now = clock.now();
  if (now < lastMs) factory = monotonicFactory();
  lastMs = now;
  return factory(now);
}

/** The Unix milliseconds in a ULID. */
export function ulidTime(id: string): number {
  return decodeTime(id);
}

/** A request id (`client_request_id`): a ULID, well inside the 80-byte cap of SPEC section 2. */
export function mintRequestId(clock: Clock): string {
  return mintUlid(clock);
}

/** The SHA-256 of `bytes` as 64 lower-case hex characters (what `X-Content-SHA256` takes). */
export async function sha256Hex(bytes: ArrayBuffer | Uint8Array): Promise<string> {
  const view = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
  const digest = await crypto.subtle.digest("SHA-256", view as Uint8Array<ArrayBuffer>);
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}
