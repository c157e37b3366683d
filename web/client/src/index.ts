// The Spark engine's browser client (SPEC sections 6 and 12).
export { SparkClient, clockError, CLIENT_HEADER, DEFAULT_REQUEST_TIMEOUT_MS, MAX_JSON_BODY_BYTES, UPLOAD_BYTES_PER_S, type CaptureInput, type PhotoInput, type ClientOptions, type ChangeNotice, type PassReport, type Resync, type EventSourceConstructor, type Link, type SendState, type WithdrawOutcome } from "./client.js";
export { Outbox, STEPS, MAX_PHOTOS, DB_NAME, entrySteps, stepKey, normaliseEntry, type Entry, type MessageRecord, type MessageState, type MessageError, type Step, type MediaFile, type PhotoFiles, type PlannedStep, type Role, type Parked } from "./outbox.js";
export { classify, statusClass, parseRetryAfter, backoffDelay, DEFAULT_BACKOFF, type Verdict, type WaitCause, type Refusal, type Backoff, type Problem } from "./answers.js";
export { mintUlid, mintRequestId, ulidTime, sha256Hex } from "./ids.js";
export { systemClock, ManualClock, type Clock } from "./clock.js";
export { LastSeen, LAST_SEEN_DB_NAME, LAST_SEEN_THUMBS_MAX, LAST_SEEN_THUMB_PX, type Snapshot, type Thumb } from "./lastseen.js";
export { makeCopy, fitWithin, COPY_MAX_PX } from "./image.js";
export { CLOCK_WINDOW_MS, REUSE_MARGIN_MS } from "./generated/rules.js";
export type { components, paths } from "./generated/api.js";
