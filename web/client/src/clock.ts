// The client's clock: ADR-036 compares a message id's time with the page's
// own clock, the only one it has (SPEC section 6).

/** A source of Unix milliseconds. */
export interface Clock {
  now(): number;
}

/** The page's clock, `Date.now()`. */
export const systemClock: Clock = { now: () => Date.now() };

/** A clock that moves only when told to (tests). */
export class ManualClock implements Clock {
  constructor(public ms: number) {}
  now(): number {
    return this.ms;
  }
  advance(ms: number): void {
    this.ms += ms;
  }
}
