// An in-process stand-in for the engine's write routes, for the unit tests
// of the client's rules: it keeps the engine's idempotency (SPEC section 3),
// media hashes and the clock window of message ids (SPEC section 5) with a
// server clock the test moves, and lets a test script answers (a status, a
// dropped answer after the write, a network error). The same client runs
// against the real engine in Chromium (web/e2e/).
import { CLOCK_WINDOW_MS } from "../dist/index.js";
import { decodeTime } from "ulid";

const json = (status, body, headers = {}) =>
  new Response(JSON.stringify(body), { status, headers: { "content-type": status >= 400 ? "application/problem+json" : "application/json", ...headers } });
const problem = (status, code, detail, extra = {}) => json(status, { type: `urn:spark:problem:${code}`, title: code, status, detail, code, ...extra });

export class FakeEngine {
  constructor(serverNow) {
    this.now = serverNow;
    this.moments = new Map();
    this.requests = new Map();
    this.media = new Map();
    this.turns = new Map();
    this.messages = new Map();
    /** Every request seen: { method, path, headers, body }. */
    this.log = [];
    /** Scripted behaviours, one per request in order: a function (req) => Response | "drop" | Error | undefined, or a promise of one. */
    this.script = [];
    this.fetch = this.fetch.bind(this);
  }

  async fetch(url, init = {}) {
    const path = new URL(url, "http://engine").pathname;
    const method = init.method ?? "GET";
    const headers = Object.fromEntries(Object.entries(init.headers ?? {}).map(([k, v]) => [k.toLowerCase(), v]));
    let body = init.body;
    if (body instanceof ArrayBuffer) body = new Uint8Array(body);
    const req = { method, path, headers, body };
    this.log.push(req);
    const scripted = this.script.shift();
    // A promise holds the request in flight until it settles (then as its value).
    let outcome = scripted ? scripted(req) : undefined;
    if (outcome instanceof Promise) outcome = await outcome;
    if (outcome instanceof Error) throw outcome;
    if (outcome instanceof Response) return outcome;
    const answer = await this.handle(req);
    if (outcome === "drop") throw new TypeError("Failed to fetch (the answer was lost)");
    return answer;
  }

  async handle({ method, path, headers, body }) {
    let m;
    // Like the engine: a body read as JSON must be declared JSON.
    const type = (headers["content-type"] ?? "").split(";")[0].trim().toLowerCase();
    const declaredJson = type === "application/json" || /^application\/.+\+json$/.test(type);
    if (method !== "GET" && !path.startsWith("/api/media/") && (body !== undefined || type !== "") && !declaredJson) {
      return problem(415, "unsupported_media_type", "this route reads its body as JSON: send Content-Type: application/json");
    }
    if (method === "POST" && path === "/api/moments") {
      const b = JSON.parse(body);
      const known = this.requests.get(b.client_request_id) ?? (b.id && this.moments.get(b.id));
      if (known) return json(200, { created: false, moment: known });
      const moment = { id: b.id, text: b.text, media: [], turns: [] };
      this.moments.set(b.id, moment);
      this.requests.set(b.client_request_id, moment);
      return json(201, { created: true, moment });
    }
    if (method === "PUT" && (m = path.match(/^\/api\/media\/(\w+)$/))) {
      // As the engine (issue 27): `X-Photo` 0 to 9 (0 when absent); each
      // photo of a moment holds one copy and one original.
      const photoHeader = headers["x-photo"];
      if (photoHeader !== undefined && !(/^[0-9]{1,3}$/.test(photoHeader) && Number(photoHeader) < 10)) return problem(400, "invalid_request", `X-Photo ${JSON.stringify(photoHeader)} is not a photo number from 0 to 9`);
      const photo = Number(photoHeader ?? 0);
      const role = headers["x-media-role"];
      const moment = this.moments.get(headers["x-moment-id"]);
      if (!moment) return problem(404, "not_found", "no such moment");
      const digest = Buffer.from(await crypto.subtle.digest("SHA-256", body)).toString("hex");
      if (headers["x-content-sha256"] && headers["x-content-sha256"] !== digest) return problem(400, "digest_mismatch", "hash");
      const known = this.media.get(m[1]);
      if (known) {
        const same = known.sha256 === digest && known.moment_id === moment.id && known.role === role && known.photo === photo;
        if (same) return json(200, { created: false, media: known });
        return known.sha256 !== digest
          ? problem(409, "conflict", "other bytes", { conflict: "media_bytes", media_id: known.id })
          : problem(409, "conflict", "another moment, photo or role", { conflict: "media_owner", media_id: known.id, moment_id: known.moment_id, photo: known.photo, role: known.role });
      }
      const taken = moment.media.find((x) => x.photo === photo && x.role === role);
      if (taken) return problem(409, "conflict", `photo ${photo} of this moment already has a ${role}`, { conflict: "media_role", media_id: taken.id, moment_id: moment.id, photo, role });
      const media = { id: m[1], moment_id: moment.id, role, photo, sha256: digest, size: body.length, content_type: headers["content-type"] ?? "application/octet-stream" };
      this.media.set(m[1], media);
      moment.media.push(media);
      return json(201, { created: true, media });
    }
    if (method === "POST" && (m = path.match(/^\/api\/moments\/(\w+)\/turns$/))) {
      if (!this.moments.has(m[1])) return problem(404, "not_found", "no such moment");
      const b = JSON.parse(body);
      const known = this.turns.get(b.client_request_id);
      if (known) return json(200, { created: false, turn: known });
      const turn = { id: `T${this.turns.size + 1}`, moment_id: m[1], status: "running" };
      this.turns.set(b.client_request_id, turn);
      return json(202, { created: true, turn });
    }
    if (method === "GET" && (m = path.match(/^\/api\/moments\/(\w+)$/))) {
      const moment = this.moments.get(m[1]);
      return moment ? json(200, moment) : problem(404, "not_found", "no such moment");
    }
    if (method === "POST" && path === "/api/messages") {
      const b = JSON.parse(body);
      const known = this.messages.get(b.id);
      if (known) return known.body === b.body ? json(202, { created: false, message: known }) : problem(409, "conflict", "other body");
      const idTime = decodeTime(b.id);
      // As the engine: the id's time minus the server's (below 0: the page is behind).
      const skew = idTime - this.now();
      if (Math.abs(skew) > CLOCK_WINDOW_MS) {
        return problem(400, "clock_skew", `the id's time is ${skew} ms from the server's`, { server_time_ms: this.now(), id_time_ms: idTime, skew_ms: skew });
      }
      const message = { id: b.id, thread_id: b.thread_id, body: b.body, ts: new Date(this.now()).toISOString() };
      this.messages.set(b.id, message);
      return json(202, { created: true, message });
    }
    return problem(404, "not_found", "no such route");
  }
}
