import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { SQLiteFencedStore, StaleTokenError } from "../src/fencing.js";

function dbPath(): string {
  return join(mkdtempSync(join(tmpdir(), "agentq-fence-")), "sink.db");
}

test("a lower token is refused, an equal one accepted", () => {
  const store = SQLiteFencedStore.open(`sqlite://${dbPath()}`);
  store.write("job", 5, { by: "a" });
  assert.equal(store.write("job", 5, { by: "a", again: true }).revision, 2);
  store.fence("job", 9);
  assert.throws(
    () => store.write("job", 5, "zombie"),
    (err: unknown) => err instanceof StaleTokenError && err.token === 5 && err.highest === 9 && err.key === "job",
  );
  // The fence raised the token and kept the value; the refused write changed nothing.
  assert.deepEqual(store.read("job"), { key: "job", token: 9, value: { by: "a", again: true }, revision: 3 });
  store.fence("other", 1); // keys are fenced independently
  assert.throws(() => store.write("job", 0, 1), /not an integer/);
  assert.equal(store.ref("job"), `sqlite://${store.path}#agentq_fenced/job`);
  store.close();
});

test("the caller's rows commit or roll back with the fence", () => {
  const store = SQLiteFencedStore.open(`sqlite://${dbPath()}`);
  const insert = (token: number): unknown =>
    store.transaction("job", token, (db) => {
      db.prepare("INSERT INTO findings VALUES ('job', 'x')").run();
      return { findings: 1 };
    });
  store.transaction("setup", 1, (db) => {
    db.exec("CREATE TABLE findings (task TEXT, text TEXT)");
    return undefined;
  });
  insert(4);
  store.fence("job", 6);
  assert.throws(() => insert(4), StaleTokenError);
  const db = (store as unknown as { db: { prepare(s: string): { get(): { n: number } } } }).db;
  assert.equal(db.prepare("SELECT count(*) AS n FROM findings").get().n, 1);
  store.close();
});

/** Writers in processes of their own: a lower token never overwrites a higher one. */
test("concurrent writers in separate processes never let a lower token win", async () => {
  const path = dbPath();
  SQLiteFencedStore.open(`sqlite://${path}`).close();
  const script = `
    import { SQLiteFencedStore, StaleTokenError } from ${JSON.stringify(new URL("../src/fencing.js", import.meta.url).href)};
    const store = SQLiteFencedStore.open(process.argv[1]);
    let seed = Number(process.argv[2]);
    const accepted = [];
    for (let i = 0; i < 25; i++) {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      const token = (seed % 50) + 1;
      try { store.write("k", token, { token }); accepted.push(token); }
      catch (err) { if (!(err instanceof StaleTokenError) || err.highest <= token) throw err; }
    }
    process.stdout.write(JSON.stringify(accepted));
  `;
  const runs = [1, 2, 3, 4].map(
    (seed) =>
      new Promise<number[]>((resolve, reject) => {
        const child = spawn(process.execPath, ["--input-type=module", "-e", script, `sqlite://${path}`, String(seed)]);
        let out = "";
        let err = "";
        child.stdout.on("data", (d: Buffer) => (out += d.toString()));
        child.stderr.on("data", (d: Buffer) => (err += d.toString()));
        child.on("close", (code) => (code === 0 ? resolve(JSON.parse(out) as number[]) : reject(new Error(err))));
      }),
  );
  const accepted = (await Promise.all(runs)).flat();
  const highest = Math.max(...accepted);
  const store = SQLiteFencedStore.open(`sqlite://${path}`);
  const record = store.read("k");
  assert.equal(record?.token, highest);
  assert.deepEqual(record?.value, { token: highest });
  assert.equal(record?.revision, accepted.length, "every accepted write counted once");
  store.close();
});
