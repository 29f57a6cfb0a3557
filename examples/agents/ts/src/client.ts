/**
 * A small TypeScript client of agentq's agent API: the local HTTP API that
 * `agentq sidecar` serves to the agent in the same pod (docs/agent-api.md).
 *
 *     const client = new SidecarClient();          // $AGENTQ_SIDECAR_URL, $AGENTQ_SIDECAR_TOKEN_FILE
 *     await client.offers(30, async (a) => {
 *       const lease = await client.hold(a);         // beats now, then on a timer
 *       try {
 *         lease.progress("step 1/3");               // throws the 409 once the lease is lost
 *         await lease.complete({ answer: 42 });
 *       } finally { lease.close(); }
 *     });
 *
 * Request and response types come from src/api.gen.ts, generated from
 * docs/agent-api.openapi.yaml by openapi-typescript (`npm run generate`; the tests fail
 * when it is out of date). Paths, bodies and answers are checked against it at compile
 * time: `request()` takes only a path of the spec, and the body and answer of that path.
 *
 * Every call carries the sidecar's secret as `Authorization: Bearer`, read from its token
 * file for every request (a restarted sidecar writes a new one); a 401 answered to a
 * secret that has since changed is sent again once with the new one. Node's own fetch.
 */
import { readFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";

import type { components, paths } from "./api.gen.js";

export const DEFAULT_URL = "http://127.0.0.1:8700";
export const DEFAULT_TOKEN_FILE = "/run/agentq/sidecar-token";
export const URL_ENV = "AGENTQ_SIDECAR_URL";
export const TOKEN_FILE_ENV = "AGENTQ_SIDECAR_TOKEN_FILE";
const SEEN_MEMORY = 4096;

export type Assignment = components["schemas"]["Assignment"];
export type AssignmentList = components["schemas"]["AssignmentList"];
export type ReportAccepted = components["schemas"]["ReportAccepted"];
export type ErrorBody = components["schemas"]["Error"];
export type Status = components["schemas"]["Status"];

type Method = "get" | "post";
type Operation<P extends keyof paths, M extends Method> = NonNullable<paths[P][M]>;
/** The JSON body of an operation, as the spec has it. */
export type RequestBody<P extends keyof paths, M extends Method> =
  Operation<P, M> extends { requestBody: { content: { "application/json": infer B } } } ? B : never;
/** The JSON answer (200) of an operation, as the spec has it. */
export type Answer<P extends keyof paths, M extends Method> =
  Operation<P, M> extends { responses: { 200: { content: { "application/json": infer R } } } } ? R : never;
export type ListQuery = NonNullable<Operation<"/v1/assignments", "get">["parameters"]["query"]>;
export type HeartbeatRequest = RequestBody<"/v1/assignments/{task}/heartbeat", "post">;
export type CompleteRequest = RequestBody<"/v1/assignments/{task}/complete", "post">;
export type FailRequest = RequestBody<"/v1/assignments/{task}/fail", "post">;

/** The sidecar refused a request: its status and JSON body. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly body: ErrorBody,
  ) {
    super(`${status} ${body.error}: ${body.message}`);
    this.name = "ApiError";
  }
  get code(): string {
    return this.body.error;
  }
  /** 409: the attempt is no longer this agent's (lost, stale, revoked): stop working on it. */
  get lost(): boolean {
    return this.status === 409;
  }
  /** The operator revoked the claim (a cancel, a deadline); fenceToken is above the attempt's. */
  get revoked(): boolean {
    return this.lost && (this.code === "Cancelled" || this.code === "DeadlineExceeded");
  }
  get fenceToken(): number | undefined {
    return this.body.fenceToken;
  }
}

/** The sidecar could not be reached or answered 5xx (starting, not ready, the API server away): retry. */
export class UnavailableError extends Error {
  constructor(override readonly cause: unknown) {
    super(`sidecar unavailable: ${cause instanceof Error ? cause.message : String(cause)}`);
    this.name = "UnavailableError";
  }
}

export function isLost(err: unknown): err is ApiError {
  return err instanceof ApiError && err.lost;
}

export class SidecarClient {
  readonly url: string;
  readonly tokenFile: string;
  /** Bounds a request that is not a long poll (a long poll gets its wait on top), ms. */
  timeoutMs = 30_000;

  constructor(url?: string, tokenFile?: string) {
    this.url = (url || process.env[URL_ENV] || DEFAULT_URL).replace(/\/+$/, "");
    this.tokenFile = tokenFile || process.env[TOKEN_FILE_ENV] || DEFAULT_TOKEN_FILE;
  }

  private secret(): string {
    try {
      return readFileSync(this.tokenFile, "utf8").trim();
    } catch (err) {
      throw new UnavailableError(err); // not written yet: the sidecar is starting
    }
  }

  /** One call of an operation of the spec: `path` is a path of the spec, `task` fills `{task}`. */
  async request<P extends keyof paths, M extends Method>(
    method: M,
    path: P,
    options: {
      task?: string;
      query?: Record<string, string>;
      body?: RequestBody<P, M>;
      waitMs?: number;
      signal?: AbortSignal | undefined;
    } = {},
  ): Promise<Answer<P, M>> {
    let target = this.url + path.replace("{task}", encodeURIComponent(options.task ?? ""));
    if (options.query && Object.keys(options.query).length > 0) {
      target += "?" + new URLSearchParams(options.query).toString();
    }
    const payload = options.body === undefined ? undefined : JSON.stringify(options.body);
    for (let attempt = 0; ; attempt++) {
      const secret = this.secret();
      const headers: Record<string, string> = { Authorization: `Bearer ${secret}`, Accept: "application/json" };
      if (payload !== undefined) headers["Content-Type"] = "application/json";
      let response: Response;
      let text: string;
      try {
        response = await fetch(target, {
          method: method.toUpperCase(),
          headers,
          body: payload,
          signal: AbortSignal.any([
            AbortSignal.timeout(this.timeoutMs + (options.waitMs ?? 0)),
            ...(options.signal ? [options.signal] : []),
          ]),
        });
        text = await response.text();
      } catch (err) {
        throw new UnavailableError(err);
      }
      if (response.status === 200) return JSON.parse(text) as Answer<P, M>;
      let body: ErrorBody;
      try {
        body = JSON.parse(text) as ErrorBody;
      } catch {
        body = { error: response.statusText, message: text };
      }
      if (response.status === 401 && attempt === 0) {
        let now: string | undefined;
        try {
          now = this.secret();
        } catch {
          now = undefined;
        }
        if (now !== undefined && now !== secret) continue; // a restarted sidecar's new secret
      }
      const err = new ApiError(response.status, body);
      if (response.status >= 500) throw new UnavailableError(err);
      throw err;
    }
  }

  /** GET /v1/assignments; with `wait`, a long poll (`signal` ends it early). */
  list(query: ListQuery = {}, signal?: AbortSignal): Promise<AssignmentList> {
    const q: Record<string, string> = {};
    if (query.wait !== undefined) q.wait = String(query.wait);
    if (query.after !== undefined) q.after = String(query.after);
    if (query.until !== undefined) q.until = query.until;
    return this.request("get", "/v1/assignments", { query: q, waitMs: (query.wait ?? 0) * 1000, signal });
  }

  get(task: string): Promise<Assignment> {
    return this.request("get", "/v1/assignments/{task}", { task });
  }

  heartbeat(task: string, body: HeartbeatRequest): Promise<Assignment> {
    return this.request("post", "/v1/assignments/{task}/heartbeat", { task, body });
  }

  complete(task: string, body: CompleteRequest): Promise<ReportAccepted> {
    return this.request("post", "/v1/assignments/{task}/complete", { task, body });
  }

  fail(task: string, body: FailRequest): Promise<ReportAccepted> {
    return this.request("post", "/v1/assignments/{task}/fail", { task, body });
  }

  status(): Promise<Status> {
    return this.request("get", "/v1/status");
  }

  /**
   * Calls `fn` with every new attempt granted to this worker, once each, as they come, until
   * `signal` aborts (then it returns) or the sidecar refuses the listing for good (a 4xx, e.g.
   * 401: thrown). A sidecar that is starting, unreachable or failing (5xx) is waited out. After
   * the first listing it long-polls with until=offers: a report or heartbeat does not end it.
   * `fn` is not awaited: attempts run side by side.
   */
  async offers(poll: number, fn: (a: Assignment) => unknown, signal?: AbortSignal): Promise<void> {
    const seen = new Set<string>(); // insertion-ordered: the oldest is forgotten first
    let version: number | undefined;
    while (!signal?.aborted) {
      let list: AssignmentList;
      try {
        list = await this.list(
          version === undefined ? { wait: poll } : { wait: poll, after: version, until: "offers" },
          signal,
        );
      } catch (err) {
        if (signal?.aborted) break;
        if (!(err instanceof UnavailableError)) throw err;
        version = undefined; // a restarted sidecar counts its versions anew
        await sleep(500, undefined, { signal }).catch(() => undefined);
        continue;
      }
      version = list.version;
      for (const a of list.assignments) {
        const key = `${a.task}\u0000${a.token}`;
        if (a.state !== "active" || seen.has(key)) continue;
        seen.add(key);
        if (seen.size > SEEN_MEMORY) seen.delete(seen.values().next().value as string);
        void fn(a);
      }
    }
  }

  /** Starts heartbeating an attempt (the first beat at once); rejects with its 409 if lost. */
  hold(a: Assignment, onRevoke?: (fenceToken: number) => void): Promise<Lease> {
    return Lease.hold(this, a, onRevoke);
  }
}

/**
 * Heartbeats one attempt on a timer while the agent works: at once (the first beat makes the
 * task Running), then every third of the heartbeat interval, with the progress marker when it
 * changed. A 409 marks the lease lost: `err` holds it, and `progress()`, `complete()` and
 * `fail()` throw it (the reports still ask the sidecar, the only judge). A revoked claim calls
 * `onRevoke` with the revocation's fence token, once.
 */
export class Lease {
  readonly periodMs: number;
  private marker: string | undefined;
  private sent: string | undefined;
  private lostError: ApiError | undefined;
  private finished = false;
  private revoked = false;
  private closed = false;
  private timer: NodeJS.Timeout | undefined;
  private deadline: number;

  private constructor(
    private readonly client: SidecarClient,
    readonly assignment: Assignment,
    private readonly onRevoke?: (fenceToken: number) => void,
  ) {
    this.periodMs = Math.max(100, (assignment.heartbeatIntervalSeconds * 1000) / 3);
    const parsed = Date.parse(assignment.leaseDeadline);
    this.deadline = Number.isNaN(parsed) ? Date.now() + assignment.leaseDurationSeconds * 1000 : parsed;
  }

  static async hold(client: SidecarClient, a: Assignment, onRevoke?: (fenceToken: number) => void): Promise<Lease> {
    const lease = new Lease(client, a, onRevoke);
    await lease.beat();
    lease.schedule();
    return lease;
  }

  private schedule(): void {
    if (this.closed || this.lostError || this.finished) return;
    this.timer = setTimeout(() => {
      this.beat().then(
        () => this.schedule(),
        () => this.schedule(),
      );
    }, this.periodMs);
  }

  /** One heartbeat now; throws the 409 (and marks the lease lost). */
  private async beat(): Promise<void> {
    if (this.lostError) throw this.lostError;
    if (this.finished) return;
    const body: HeartbeatRequest = { token: this.assignment.token };
    const marker = this.marker;
    if (marker !== undefined && marker !== this.sent) body.progress = marker;
    try {
      const answer = await this.client.heartbeat(this.assignment.task, body);
      if (body.progress !== undefined) this.sent = body.progress ?? undefined;
      const parsed = Date.parse(answer.leaseDeadline);
      if (!Number.isNaN(parsed)) this.deadline = parsed;
    } catch (err) {
      if (isLost(err)) {
        this.markLost(err);
        throw err;
      }
      if (Date.now() > this.deadline) {
        // Unreachable past the lease deadline: the operator will have reclaimed it.
        const presumed = new ApiError(0, {
          error: "LeaseDeadlinePassed",
          message: `the sidecar was unreachable past the lease deadline: ${String(err)}`,
        });
        this.markLost(presumed);
        throw presumed;
      }
      throw err;
    }
  }

  private markLost(err: ApiError): void {
    this.lostError ??= err;
    const fence = err.fenceToken;
    if (err.revoked && fence !== undefined && !this.revoked && this.onRevoke) {
      this.revoked = true;
      this.onRevoke(fence);
    }
  }

  /** The 409 once the lease is lost, else undefined. */
  get err(): ApiError | undefined {
    return this.lostError;
  }

  /** Sets the marker the next heartbeat carries; throws the 409 if the lease is lost. */
  progress(marker: string): void {
    this.marker = marker;
    if (this.lostError) throw this.lostError;
  }

  /** Asks the sidecar now (a heartbeat): resolves while the attempt is still ours. */
  check(): Promise<void> {
    return this.beat();
  }

  complete(result?: unknown, resultRef?: string): Promise<ReportAccepted> {
    const body: CompleteRequest = { token: this.assignment.token };
    if (result !== undefined) body.result = result;
    if (resultRef !== undefined) body.resultRef = resultRef;
    return this.report(() => this.client.complete(this.assignment.task, body));
  }

  /** Reports failure: retryable lets another attempt try, else the task ends Failed. */
  fail(reason: string, message: string, retryable: boolean): Promise<ReportAccepted> {
    return this.report(() =>
      this.client.fail(this.assignment.task, { token: this.assignment.token, reason, message, retryable }),
    );
  }

  /** Sends a report; while the sidecar cannot take it (503), again with backoff (it is idempotent). */
  private async report(send: () => Promise<ReportAccepted>): Promise<ReportAccepted> {
    let delay = 500;
    for (;;) {
      try {
        const answer = await send();
        this.finished = true;
        this.close();
        return answer;
      } catch (err) {
        if (isLost(err)) {
          this.markLost(err);
          throw err;
        }
        if (!(err instanceof UnavailableError) || this.closed) throw err;
        if (this.lostError) throw this.lostError;
        await sleep(delay);
        delay = Math.min(delay * 2, 5000);
      }
    }
  }

  /** Stops the heartbeats. */
  close(): void {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
  }
}
