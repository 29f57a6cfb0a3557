import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { ApiError, type Assignment, type ErrorBody, isLost, SidecarClient, UnavailableError } from "../src/client.js";

interface Call {
  method: string;
  path: string;
  query: string;
  body: Record<string, unknown> | undefined;
}

type Answer = (req: IncomingMessage, body: Record<string, unknown> | undefined) => [number, unknown];

/** A sidecar stand-in: it checks the secret and the content type, records the calls. */
class Fake {
  secret = "s3cret";
  calls: Call[] = [];
  server: Server;
  constructor(public answer: Answer) {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        const url = new URL(req.url ?? "/", "http://x");
        let body: Record<string, unknown> | undefined;
        if (req.method === "POST") {
          assert.equal(req.headers["content-type"], "application/json");
          body = JSON.parse(Buffer.concat(chunks).toString()) as Record<string, unknown>;
        }
        this.calls.push({ method: req.method ?? "", path: url.pathname, query: url.search.slice(1), body });
        res.setHeader("Content-Type", "application/json");
        if (req.headers.authorization !== `Bearer ${this.secret}`) {
          res.writeHead(401).end(JSON.stringify({ error: "Unauthorized", message: "wrong secret" }));
          return;
        }
        const [status, out] = this.answer(req, body);
        res.writeHead(status).end(JSON.stringify(out));
      });
    });
  }
  async start(): Promise<{ client: SidecarClient; tokenFile: string }> {
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    after(() => this.server.close());
    const tokenFile = join(mkdtempSync(join(tmpdir(), "agentq-ts-")), "sidecar-token");
    writeFileSync(tokenFile, "s3cret\n", { mode: 0o600 });
    const { port } = this.server.address() as AddressInfo;
    return { client: new SidecarClient(`http://127.0.0.1:${port}`, tokenFile), tokenFile };
  }
}

function assignment(task: string, token: number, heartbeatIntervalSeconds = 0.6): Assignment {
  return {
    task,
    namespace: "ns",
    worker: "w",
    attempt: 1,
    token,
    leaseDurationSeconds: 3,
    heartbeatIntervalSeconds,
    leaseDeadline: new Date(Date.now() + 3000).toISOString(),
    leaseRemainingSeconds: 3,
    state: "active",
    renewed: false,
  };
}

test("every call carries the secret; a restarted sidecar's new one is picked up", async () => {
  const fake = new Fake(() => [200, assignment("t1", 7)]);
  const { client, tokenFile } = await fake.start();
  assert.equal((await client.get("t1")).token, 7);
  fake.secret = "n3w";
  writeFileSync(tokenFile, "n3w");
  assert.equal((await client.get("t1")).token, 7); // the 401 was sent again with the new secret
  fake.secret = "other";
  await assert.rejects(client.get("t1"), (err: unknown) => err instanceof ApiError && err.status === 401);
});

test("a missing token file is unavailable, not fatal", async () => {
  const client = new SidecarClient("http://127.0.0.1:1", "/nonexistent/sidecar-token");
  await assert.rejects(client.get("t1"), UnavailableError);
});

test("offers long-polls for new attempts only and hands each out once", async () => {
  let listings = 0;
  const fake = new Fake((): [number, unknown] => {
    listings++;
    if (listings === 1) return [200, { worker: "w", namespace: "ns", version: 3, assignments: [assignment("a", 10)] }];
    if (listings === 2) return [503, { error: "NotReady", message: "starting" }];
    if (listings === 3) {
      const reported = { ...assignment("b", 12), state: "reported" };
      return [
        200,
        { worker: "w", namespace: "ns", version: 1, assignments: [assignment("a", 10), assignment("a", 11), reported] },
      ];
    }
    return [200, { worker: "w", namespace: "ns", version: 1, assignments: [] }];
  });
  const { client } = await fake.start();
  const stop = new AbortController();
  const got: number[] = [];
  await client.offers(
    0.01,
    (a) => {
      got.push(a.token);
      if (got.length === 2) stop.abort();
    },
    stop.signal,
  );
  assert.deepEqual(got, [10, 11]);
  assert.equal(fake.calls[0]?.query, "wait=0.01");
  assert.equal(fake.calls[1]?.query, "wait=0.01&after=3&until=offers");
  assert.equal(fake.calls[2]?.query, "wait=0.01", "after a 503 the listing starts over");
});

test("a lease beats with progress only when it changed, and stops at a 409", async () => {
  let beats = 0;
  const fake = new Fake((): [number, unknown] => {
    beats++;
    if (beats >= 4) return [409, { error: "LeaseLost", message: "its Lease was deleted" }];
    return [200, assignment("t1", 7)];
  });
  const { client } = await fake.start();
  const lease = await client.hold(assignment("t1", 7, 0.3)); // beats every 100 ms
  lease.progress("step 1");
  const deadline = Date.now() + 5000;
  while (!lease.err && Date.now() < deadline) await sleep(20);
  assert.equal(lease.err?.code, "LeaseLost");
  assert.throws(() => lease.progress("step 2"), (err: unknown) => isLost(err));
  await sleep(300);
  assert.equal(fake.calls.length, 4, "no beat after the 409");
  assert.equal(fake.calls[0]?.path, "/v1/assignments/t1/heartbeat");
  assert.deepEqual(fake.calls[0]?.body, { token: 7 });
  assert.deepEqual(fake.calls[1]?.body, { token: 7, progress: "step 1" });
  assert.deepEqual(fake.calls[2]?.body, { token: 7 }, "unchanged progress is not sent again");
  await assert.rejects(lease.complete(1), (err: unknown) => isLost(err)); // the sidecar says 409 too
  lease.close();
});

test("a revoked claim calls onRevoke with the fence token, once", async () => {
  const body: ErrorBody = { error: "Cancelled", message: "cancelled", fenceToken: 8 };
  const fake = new Fake(() => [409, body]);
  const { client } = await fake.start();
  const fenced: number[] = [];
  await assert.rejects(
    client.hold(assignment("t1", 7), (fence) => fenced.push(fence)),
    (err: unknown) => err instanceof ApiError && err.revoked && err.fenceToken === 8,
  );
  assert.deepEqual(fenced, [8]);
});

test("reports are sent again while the sidecar cannot take them", async () => {
  let reports = 0;
  const fake = new Fake((req): [number, unknown] => {
    if (req.url?.endsWith("/heartbeat")) return [200, assignment("t1", 7)];
    reports++;
    if (reports === 1) return [503, { error: "ApiUnavailable", message: "the API server did not take it" }];
    return [200, { task: "t1", token: 7, state: "reported" }];
  });
  const { client } = await fake.start();
  const lease = await client.hold(assignment("t1", 7));
  const answer = await lease.fail("ToolError", "boom", false);
  assert.equal(answer.state, "reported");
  const sent = fake.calls.filter((c) => c.path === "/v1/assignments/t1/fail");
  assert.equal(sent.length, 2);
  assert.deepEqual(sent[1]?.body, { token: 7, reason: "ToolError", message: "boom", retryable: false });
});
