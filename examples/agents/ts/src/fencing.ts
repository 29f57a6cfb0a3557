/**
 * A fenced key-value store on SQLite: the rule of agentq.fencing (docs/fencing.md).
 *
 * Per key, the store keeps the highest fencing token seen, a value (JSON) and a revision.
 * In one transaction with the data it checks the token and raises it:
 * - `write(key, token, value)` throws StaleTokenError if `token` is lower than the key's
 *   highest; otherwise it stores the value and the token, revision + 1;
 * - `fence(key, token)` is the same check, raising the token without writing a value: fence
 *   at the start of an attempt, so an older attempt's later write is refused;
 * - an equal token is accepted (the same attempt may write again, or retry).
 *
 * The table is agentq.fencing's (agentq_fenced: key, token, value, revision, updated_at), so
 * TypeScript, Go and Python agents can share a database and fence each other. The transaction
 * is BEGIN IMMEDIATE: SQLite takes the write lock before the read, so writers in any number of
 * processes are serialised, each reading the token the previous one committed.
 */
import Database from "better-sqlite3";

export const DEFAULT_TABLE = "agentq_fenced";
const MAX_TOKEN = 2n ** 63n - 1n;
const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;

/** A newer attempt owns the key: stop, and discard the work. */
export class StaleTokenError extends Error {
  constructor(
    readonly key: string,
    readonly token: number,
    readonly highest: number,
  ) {
    super(
      `write to ${JSON.stringify(key)} with fencing token ${token} refused: the store has already seen ` +
        `token ${highest} for it (a newer attempt owns it; stop and discard this work)`,
    );
    this.name = "StaleTokenError";
  }
}

export interface FencedRecord {
  key: string;
  token: number;
  value: unknown;
  revision: number;
}

interface Row {
  token: bigint;
  value: string | null;
  revision: bigint;
}

export class SQLiteFencedStore {
  private readonly db: Database.Database;

  constructor(
    readonly path: string,
    readonly table: string = DEFAULT_TABLE,
    timeoutMs = 30_000,
  ) {
    if (!IDENTIFIER.test(table)) throw new Error(`${JSON.stringify(table)} is not a plain SQL identifier`);
    this.db = new Database(path, { timeout: timeoutMs });
    this.db.pragma("journal_mode = WAL");
    this.db.exec(
      `CREATE TABLE IF NOT EXISTS ${table} (key TEXT PRIMARY KEY, token INTEGER NOT NULL, value TEXT, ` +
        "revision INTEGER NOT NULL, updated_at TEXT NOT NULL)",
    );
  }

  /** A store from agentq.fencing's URL form: sqlite:///abs/path.db or sqlite://relative.db. */
  static open(url: string): SQLiteFencedStore {
    if (!url.startsWith("sqlite://") || url.length === "sqlite://".length) {
      throw new Error(`not a sqlite:// URL with a path: ${JSON.stringify(url)} (this example implements SQLite)`);
    }
    return new SQLiteFencedStore(url.slice("sqlite://".length));
  }

  /**
   * Checks `token` against `key` and raises it, in one transaction with whatever `fn` does on
   * the database (your own tables): a StaleTokenError, or an error of `fn`, rolls it all back.
   * `fn` gets the record before the change and returns the value to store (undefined: keep it).
   */
  transaction(
    key: string,
    token: number,
    fn: (db: Database.Database, previous: FencedRecord | undefined) => unknown,
  ): FencedRecord {
    if (typeof key !== "string" || key.length === 0 || key.length > 1024) {
      throw new Error("a key is a non-empty string of at most 1024 characters");
    }
    if (!Number.isSafeInteger(token) || token < 1 || BigInt(token) > MAX_TOKEN) {
      throw new Error(`fencing token ${token} is not an integer in [1, 2^53-1]`);
    }
    const run = this.db.transaction((): FencedRecord => {
      const row = this.db
        .prepare(`SELECT token, value, revision FROM ${this.table} WHERE key = ?`)
        .safeIntegers(true)
        .get(key) as Row | undefined;
      const previous: FencedRecord | undefined = row && {
        key,
        token: Number(row.token),
        value: row.value === null ? null : JSON.parse(row.value),
        revision: Number(row.revision),
      };
      if (row && BigInt(token) < row.token) {
        throw new StaleTokenError(key, token, Number(row.token));
      }
      const value = fn(this.db, previous);
      const revision = (previous?.revision ?? 0) + 1;
      const stamp = new Date().toISOString().replace("Z", "000+00:00");
      if (value === undefined) {
        this.db
          .prepare(
            `INSERT INTO ${this.table} (key, token, value, revision, updated_at) VALUES (?, ?, NULL, ?, ?) ` +
              "ON CONFLICT(key) DO UPDATE SET token = excluded.token, revision = excluded.revision, " +
              "updated_at = excluded.updated_at",
          )
          .run(key, token, revision, stamp);
        return { key, token, value: previous?.value ?? null, revision };
      }
      this.db
        .prepare(
          `INSERT INTO ${this.table} (key, token, value, revision, updated_at) VALUES (?, ?, ?, ?, ?) ` +
            "ON CONFLICT(key) DO UPDATE SET token = excluded.token, value = excluded.value, " +
            "revision = excluded.revision, updated_at = excluded.updated_at",
        )
        .run(key, token, JSON.stringify(value), revision, stamp);
      return { key, token, value, revision };
    });
    return run.immediate(); // BEGIN IMMEDIATE: the write lock before the read
  }

  /** Stores `value` under `key` unless a higher token was seen (StaleTokenError). */
  write(key: string, token: number, value: unknown): FencedRecord {
    return this.transaction(key, token, () => (value === undefined ? null : value));
  }

  /** Raises `key`'s token without writing a value: claim the key as an attempt starts. */
  fence(key: string, token: number): FencedRecord {
    return this.transaction(key, token, () => undefined);
  }

  read(key: string): FencedRecord | undefined {
    const row = this.db
      .prepare(`SELECT token, value, revision FROM ${this.table} WHERE key = ?`)
      .safeIntegers(true)
      .get(key) as Row | undefined;
    return (
      row && {
        key,
        token: Number(row.token),
        value: row.value === null ? null : JSON.parse(row.value),
        revision: Number(row.revision),
      }
    );
  }

  /** A reference to `key` for a report's resultRef (agentq.fencing's form). */
  ref(key: string): string {
    return `sqlite://${this.path}#${this.table}/${key}`;
  }

  close(): void {
    this.db.close();
  }
}
