#!/usr/bin/env node
/**
 * An agentq agent in TypeScript: it takes its sidecar's assignments, beats with progress while
 * it works, writes its output to a fenced SQLite sink and reports.
 *
 *     node dist/src/main.js [--sidecar URL] [--token-file FILE] [--sink sqlite:///path.db] [--poll 30]
 *                           [--step-seconds S]
 *
 * What it does with an attempt is told by the task's payload (every field optional):
 *
 *     {"action": "complete" | "fail" | "fatal" | "hold",  // default complete
 *      "steps": 3, "stepSeconds": 0.2,                   // the work: steps with progress "step i/n"
 *      "blocking": false,                                 // true: the steps check nothing (a long model call)
 *      "reason": "AgentError", "message": "..."}          // for fail (retryable) and fatal (not)
 *
 * --step-seconds overrides the payload's stepSeconds (a slower or a faster agent).
 * hold beats with a new progress marker every beat until the claim is lost or revoked. With
 * --sink it fences the task's key with its token as it starts, writes its output there when
 * the work is done, and fences the key with the revocation's token when the operator revokes
 * the claim (a cancel). A write refused by the fence means a newer attempt owns the task: the
 * work is discarded and the sidecar asked, which answers 409.
 *
 * Every event is one JSON line on stdout (started, assigned, sink-fenced, sink-written,
 * sink-refused, reported, lost, revoked, error), the same as the Go agent's.
 */
import { parseArgs } from "node:util";

import { Agent, emit } from "./agent.js";
import { SidecarClient } from "./client.js";
import { SQLiteFencedStore } from "./fencing.js";

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      sidecar: { type: "string" },
      "token-file": { type: "string" },
      sink: { type: "string" },
      poll: { type: "string", default: "30" },
      "step-seconds": { type: "string" },
    },
  });
  const client = new SidecarClient(values.sidecar, values["token-file"]);
  const sinkUrl = values.sink ?? process.env.AGENTQ_SINK;
  const sink = sinkUrl ? SQLiteFencedStore.open(sinkUrl) : undefined;
  const stepSeconds = values["step-seconds"];
  const agent = new Agent(client, sink, stepSeconds === undefined ? undefined : Number(stepSeconds));
  const stop = new AbortController();
  for (const sig of ["SIGTERM", "SIGINT"] as const) process.on(sig, () => stop.abort());
  emit("started", { sidecar: client.url });
  try {
    await client.offers(
      Number(values.poll),
      (a) => {
        emit("assigned", { task: a.task, token: a.token, attempt: a.attempt });
        return agent.attempt(a, stop.signal);
      },
      stop.signal,
    );
  } finally {
    sink?.close();
  }
  process.exit(0);
}

main().catch((err: unknown) => {
  process.stderr.write(`agent: ${String(err)}\n`);
  process.exit(1);
});
