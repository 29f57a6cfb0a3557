/**
 * The agent's behaviour: what src/main.ts runs for each attempt (see there).
 */
import { setTimeout as sleep } from "node:timers/promises";

import { type Assignment, isLost, type Lease, SidecarClient } from "./client.js";
import { SQLiteFencedStore, StaleTokenError } from "./fencing.js";

export function emit(event: string, fields: Record<string, unknown> = {}): void {
  process.stdout.write(JSON.stringify({ event, lang: "ts", ...fields }) + "\n");
}

export interface Payload {
  action: "complete" | "fail" | "fatal" | "hold";
  steps: number;
  stepSeconds: number;
  blocking: boolean;
  reason: string;
  message: string;
}

export function parsePayload(raw: unknown): Payload {
  const p: Payload = {
    action: "complete",
    steps: 3,
    stepSeconds: 0.2,
    blocking: false,
    reason: "AgentError",
    message: "failed on purpose",
  };
  if (raw === null || raw === undefined) return p;
  if (typeof raw !== "object" || Array.isArray(raw)) throw new Error("payload: not an object");
  const given = raw as Record<string, unknown>;
  if (given.action !== undefined) {
    if (!["complete", "fail", "fatal", "hold"].includes(given.action as string)) {
      throw new Error(`payload: unknown action ${JSON.stringify(given.action)}`);
    }
    p.action = given.action as Payload["action"];
  }
  if (typeof given.steps === "number") p.steps = given.steps;
  if (typeof given.stepSeconds === "number") p.stepSeconds = given.stepSeconds;
  if (typeof given.blocking === "boolean") p.blocking = given.blocking;
  if (typeof given.reason === "string") p.reason = given.reason;
  if (typeof given.message === "string") p.message = given.message;
  return p;
}

export class Agent {
  constructor(
    readonly client: SidecarClient,
    readonly sink?: SQLiteFencedStore,
    /** Overrides the payload's stepSeconds. */
    readonly stepSeconds?: number,
  ) {}

  /** Works on one assignment and says how it ended. */
  async attempt(a: Assignment, signal?: AbortSignal): Promise<void> {
    const fields = { task: a.task, token: a.token };
    try {
      await this.work(a, signal);
    } catch (err) {
      if (isLost(err)) {
        const about = { ...fields, code: err.code, status: err.status, why: err.message };
        if (err.revoked) emit("revoked", { ...about, fence: err.fenceToken });
        else emit("lost", about);
      } else if (!signal?.aborted) {
        emit("error", { ...fields, why: String(err) });
      }
    }
  }

  private async work(a: Assignment, signal?: AbortSignal): Promise<void> {
    const p = parsePayload(a.payload);
    if (this.stepSeconds !== undefined) p.stepSeconds = this.stepSeconds;
    const sink = this.sink;
    // A revoked claim has no next attempt whose writes would fence ours: the revocation's
    // token does it, so this attempt's own later writes are refused.
    const onRevoke = sink
      ? (fence: number): void => {
          const record = sink.fence(a.task, fence);
          emit("sink-fenced", { task: a.task, token: fence, revision: record.revision, why: "revoked" });
        }
      : undefined;
    const lease = await this.client.hold(a, onRevoke);
    try {
      if (sink) {
        try {
          const record = sink.fence(a.task, a.token);
          emit("sink-fenced", { task: a.task, token: a.token, revision: record.revision });
        } catch (err) {
          return await this.refused(lease, err);
        }
      }

      if (p.action === "hold") {
        for (let step = 1; ; step++) {
          lease.progress(`step-${step}`); // throws the 409 once lost
          await sleep(lease.periodMs, undefined, { signal });
        }
      }

      for (let step = 1; step <= p.steps; step++) {
        try {
          lease.progress(`step ${step}/${p.steps}`);
        } catch (err) {
          if (!p.blocking) throw err; // lost: stop now (a blocking step would not have noticed)
        }
        await sleep(p.stepSeconds * 1000, undefined, { signal });
      }

      let ref: string | undefined;
      if (sink) {
        const output = { task: a.task, token: a.token, attempt: a.attempt, by: a.worker, lang: "ts", payload: a.payload };
        try {
          // Written even if the lease was lost meanwhile: the fence is what refuses a zombie.
          const record = sink.write(a.task, a.token, output);
          emit("sink-written", { task: a.task, token: a.token, revision: record.revision });
        } catch (err) {
          return await this.refused(lease, err);
        }
        ref = sink.ref(a.task);
      }

      if (p.action === "complete") {
        await lease.complete({ by: a.worker, lang: "ts", steps: p.steps }, ref);
        emit("reported", { task: a.task, token: a.token, outcome: "Succeeded" });
      } else {
        const retryable = p.action === "fail";
        await lease.fail(p.reason, p.message, retryable);
        emit("reported", { task: a.task, token: a.token, outcome: "Failed", retryable, reason: p.reason });
      }
    } finally {
      lease.close();
    }
  }

  /** A sink write refused by the fence: the work is discarded; the sidecar, asked, answers 409. */
  private async refused(lease: Lease, err: unknown): Promise<void> {
    if (!(err instanceof StaleTokenError)) throw err;
    emit("sink-refused", { task: err.key, token: err.token, highest: err.highest, why: err.message });
    await lease.check(); // throws the 409
    throw err;
  }
}

