package fencing

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"math/rand"
	"path/filepath"
	"sync"
	"testing"
)

func open(t *testing.T, path string) *Store {
	t.Helper()
	store, err := Open("sqlite://" + path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return store
}

func TestALowerTokenIsRefusedAnEqualOneAccepted(t *testing.T) {
	ctx := context.Background()
	store := open(t, filepath.Join(t.TempDir(), "sink.db"))
	if _, err := store.Write(ctx, "job", 5, map[string]any{"by": "a"}); err != nil {
		t.Fatal(err)
	}
	rec, err := store.Write(ctx, "job", 5, map[string]any{"by": "a", "again": true})
	if err != nil || rec.Revision != 2 {
		t.Fatalf("the same token writes again: %+v %v", rec, err)
	}
	if _, err := store.Fence(ctx, "job", 9); err != nil {
		t.Fatal(err)
	}
	_, err = store.Write(ctx, "job", 5, "zombie")
	var stale *StaleTokenError
	if !errors.As(err, &stale) || stale.Token != 5 || stale.Highest != 9 || stale.Key != "job" {
		t.Fatalf("want a StaleTokenError 5 < 9, got %v", err)
	}
	got, err := store.Read(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	// The fence raised the token and kept the value; the refused write changed nothing.
	if got.Token != 9 || got.Revision != 3 || string(got.Value) != `{"again":true,"by":"a"}` {
		t.Fatalf("record %+v %s", got, got.Value)
	}
	if _, err := store.Fence(ctx, "other", 1); err != nil {
		t.Fatal("keys are fenced independently:", err)
	}
	if _, err := store.Write(ctx, "job", 0, 1); err == nil {
		t.Fatal("token 0 accepted")
	}
	if store.Ref("job") != "sqlite://"+store.Path+"#agentq_fenced/job" {
		t.Fatal(store.Ref("job"))
	}
}

func TestTheCallersRowsCommitOrRollBackWithTheFence(t *testing.T) {
	ctx := context.Background()
	store := open(t, filepath.Join(t.TempDir(), "sink.db"))
	if _, err := store.db.Exec(`CREATE TABLE findings (task TEXT, text TEXT)`); err != nil {
		t.Fatal(err)
	}
	insert := func(token int64) error {
		_, err := store.Transaction(ctx, "job", token, func(tx *sql.Tx, previous *Record) (any, error) {
			_, err := tx.ExecContext(ctx, `INSERT INTO findings VALUES ('job', 'x')`)
			return map[string]int{"findings": 1}, err
		})
		return err
	}
	if err := insert(4); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Fence(ctx, "job", 6); err != nil {
		t.Fatal(err)
	}
	if err := insert(4); err == nil {
		t.Fatal("a stale transaction committed")
	}
	var n int
	if err := store.db.QueryRow(`SELECT count(*) FROM findings`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d rows, %v", n, err)
	}
}

// Writers on connections of their own (as processes would be), random tokens: a lower
// token never overwrites a higher one, and the final record holds the highest token.
func TestConcurrentWritersNeverLetALowerTokenWin(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "sink.db")
	open(t, path)
	var wg sync.WaitGroup
	var mu sync.Mutex
	accepted := map[int64]bool{}
	highest := int64(0)
	for w := 0; w < 4; w++ {
		store := open(t, path)
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed))
			for i := 0; i < 25; i++ {
				token := rng.Int63n(50) + 1
				_, err := store.Write(ctx, "k", token, map[string]int64{"token": token})
				var stale *StaleTokenError
				switch {
				case err == nil:
					mu.Lock()
					accepted[token] = true
					highest = max(highest, token)
					mu.Unlock()
				case errors.As(err, &stale):
					if stale.Highest <= token {
						t.Errorf("refused %d for %d", token, stale.Highest)
					}
				default:
					t.Error(err)
				}
			}
		}(int64(w))
	}
	wg.Wait()
	got, err := open(t, path).Read(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	var value map[string]int64
	if err := json.Unmarshal(got.Value, &value); err != nil {
		t.Fatal(err)
	}
	if got.Token != highest || value["token"] != highest || int(got.Revision) < len(accepted) {
		t.Fatalf("final %+v %s; highest accepted %d", got, got.Value, highest)
	}
}
