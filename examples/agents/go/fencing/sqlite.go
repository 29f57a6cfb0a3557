// Package fencing refuses a write that carries a fencing token lower than one its key
// has already seen: the rule of agentq.fencing (docs/fencing.md), on SQLite.
//
// A store keeps, per key, the highest token seen, a value (JSON) and a revision. In one
// transaction with the data it checks the token and raises it:
//
//   - Write(key, token, value) is refused with *StaleTokenError if token is lower than
//     the key's highest; otherwise it stores value and token, revision + 1;
//   - Fence(key, token) is the same check, raising the token without writing a value:
//     fence at the start of an attempt, so an older attempt's later write is refused;
//   - an equal token is accepted (the same attempt may write again, or retry).
//
// The table is the one agentq.fencing's SQLiteFencedStore uses (agentq_fenced: key,
// token, value, revision, updated_at), so a Go agent and a Python one can share a
// database and fence each other. The transaction starts with BEGIN IMMEDIATE: SQLite
// takes the database's write lock before the read, so writers in any number of
// processes are serialised and each reads the token the previous one committed.
package fencing

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"regexp"
	"strings"
	"time"

	_ "modernc.org/sqlite" // the pure-Go SQLite driver ("sqlite")
)

// StaleTokenError: a newer attempt owns the key. Stop, and discard the work.
type StaleTokenError struct {
	Key     string
	Token   int64
	Highest int64
}

func (e *StaleTokenError) Error() string {
	return fmt.Sprintf(
		"write to %q with fencing token %d refused: the store has already seen token %d for it "+
			"(a newer attempt owns it; stop and discard this work)", e.Key, e.Token, e.Highest)
}

// Record is a key's state: its highest token, its value (JSON, nil if none) and revision.
type Record struct {
	Key      string
	Token    int64
	Value    json.RawMessage
	Revision int64
}

// Store is a fenced key-value store in one SQLite database file.
type Store struct {
	db    *sql.DB
	Path  string
	Table string
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// DefaultTable is agentq.fencing's table.
const DefaultTable = "agentq_fenced"

// Open opens a store from agentq.fencing's URL form, sqlite:///abs/path.db or
// sqlite://relative.db, in its table (agentq_fenced).
func Open(rawURL string) (*Store, error) {
	path, ok := strings.CutPrefix(rawURL, "sqlite://")
	if !ok {
		return nil, fmt.Errorf("not a sqlite:// URL: %q (this example implements the SQLite backend)", rawURL)
	}
	return OpenSQLite(path, DefaultTable)
}

// OpenSQLite opens (and creates if needed) the store's table in the database at path.
func OpenSQLite(path, table string) (*Store, error) {
	if path == "" {
		return nil, errors.New("a SQLite store needs a file path")
	}
	if !identifier.MatchString(table) {
		return nil, fmt.Errorf("%q is not a plain SQL identifier", table)
	}
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() +
		"?_txlock=immediate&_pragma=busy_timeout(30000)&_pragma=journal_mode(WAL)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1) // one connection: the process's writers queue here, others at the lock
	_, err = db.Exec(`CREATE TABLE IF NOT EXISTS ` + table + ` (` +
		`key TEXT PRIMARY KEY, token INTEGER NOT NULL, value TEXT, ` +
		`revision INTEGER NOT NULL, updated_at TEXT NOT NULL)`)
	if err != nil {
		db.Close()
		return nil, err
	}
	return &Store{db: db, Path: path, Table: table}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Ref is a reference to key for a report's resultRef (the form agentq.fencing uses).
func (s *Store) Ref(key string) string {
	return "sqlite://" + s.Path + "#" + s.Table + "/" + key
}

func check(key string, token int64) error {
	if key == "" || len(key) > 1024 {
		return errors.New("a key is a non-empty string of at most 1024 characters")
	}
	if token < 1 || token > math.MaxInt64 {
		return fmt.Errorf("fencing token %d is out of range [1, 2^63-1]", token)
	}
	return nil
}

// Transaction checks token against key and raises it, in one transaction with
// whatever fn does on tx (your own tables): a *StaleTokenError, or fn's error, rolls
// it all back. fn gets the record before the change (nil for a new key) and returns
// the value to store with the token (nil: keep the value as it is).
func (s *Store) Transaction(
	ctx context.Context, key string, token int64,
	fn func(tx *sql.Tx, previous *Record) (value any, err error),
) (Record, error) {
	if err := check(key, token); err != nil {
		return Record{}, err
	}
	tx, err := s.db.BeginTx(ctx, nil) // BEGIN IMMEDIATE (the DSN's _txlock)
	if err != nil {
		return Record{}, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	var previous *Record
	var value sql.NullString
	row := Record{Key: key}
	err = tx.QueryRowContext(ctx, `SELECT token, value, revision FROM `+s.Table+` WHERE key = ?`, key).
		Scan(&row.Token, &value, &row.Revision)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return Record{}, err
	default:
		if value.Valid {
			row.Value = json.RawMessage(value.String)
		}
		previous = &row
	}
	if previous != nil && token < previous.Token {
		return Record{}, &StaleTokenError{Key: key, Token: token, Highest: previous.Token}
	}
	newValue, err := fn(tx, previous)
	if err != nil {
		return Record{}, err
	}
	next := Record{Key: key, Token: token, Revision: 1}
	if previous != nil {
		next.Revision = previous.Revision + 1
		next.Value = previous.Value
	}
	stamp := time.Now().UTC().Format("2006-01-02T15:04:05.000000+00:00")
	if newValue == nil {
		_, err = tx.ExecContext(ctx, `INSERT INTO `+s.Table+` (key, token, value, revision, updated_at) `+
			`VALUES (?, ?, NULL, ?, ?) ON CONFLICT(key) DO UPDATE SET token = excluded.token, `+
			`revision = excluded.revision, updated_at = excluded.updated_at`,
			key, token, next.Revision, stamp)
	} else {
		var encoded []byte
		if encoded, err = json.Marshal(newValue); err != nil {
			return Record{}, err
		}
		next.Value = encoded
		_, err = tx.ExecContext(ctx, `INSERT INTO `+s.Table+` (key, token, value, revision, updated_at) `+
			`VALUES (?, ?, ?, ?, ?) ON CONFLICT(key) DO UPDATE SET token = excluded.token, `+
			`value = excluded.value, revision = excluded.revision, updated_at = excluded.updated_at`,
			key, token, string(encoded), next.Revision, stamp)
	}
	if err != nil {
		return Record{}, err
	}
	return next, tx.Commit()
}

// Write stores value under key unless a higher token was seen (*StaleTokenError).
func (s *Store) Write(ctx context.Context, key string, token int64, value any) (Record, error) {
	if value == nil {
		value = json.RawMessage("null")
	}
	return s.Transaction(ctx, key, token, func(*sql.Tx, *Record) (any, error) { return value, nil })
}

// Fence raises key's token to token without writing a value (*StaleTokenError if a
// higher one was seen): claim the key as an attempt starts.
func (s *Store) Fence(ctx context.Context, key string, token int64) (Record, error) {
	return s.Transaction(ctx, key, token, func(*sql.Tx, *Record) (any, error) { return nil, nil })
}

// Read returns the record under key, or nil.
func (s *Store) Read(ctx context.Context, key string) (*Record, error) {
	row := Record{Key: key}
	var value sql.NullString
	err := s.db.QueryRowContext(ctx, `SELECT token, value, revision FROM `+s.Table+` WHERE key = ?`, key).
		Scan(&row.Token, &value, &row.Revision)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if value.Valid {
		row.Value = json.RawMessage(value.String)
	}
	return &row, nil
}
