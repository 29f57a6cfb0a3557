package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// fake is a sidecar stand-in: it checks the secret and the content type, records the
// requests and answers what the test tells it.
type fake struct {
	t      *testing.T
	secret string
	mu     sync.Mutex
	calls  []call
	answer func(r *http.Request, body map[string]any) (int, any)
}

type call struct {
	Method, Path, Query string
	Body                map[string]any
}

func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if r.Method == http.MethodPost {
		if r.Header.Get("Content-Type") != "application/json" {
			f.t.Errorf("%s %s: Content-Type %q", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
		}
		data, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(data, &body); err != nil {
			f.t.Errorf("body %q: %v", data, err)
		}
	}
	f.mu.Lock()
	secret := f.secret
	f.calls = append(f.calls, call{r.Method, r.URL.Path, r.URL.RawQuery, body})
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if r.Header.Get("Authorization") != "Bearer "+secret {
		w.WriteHeader(http.StatusUnauthorized)
		json.NewEncoder(w).Encode(Error{Error: "Unauthorized", Message: "wrong secret"})
		return
	}
	status, out := f.answer(r, body)
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(out)
}

func (f *fake) recorded() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

func setup(t *testing.T, answer func(r *http.Request, body map[string]any) (int, any)) (*Client, *fake, string) {
	t.Helper()
	f := &fake{t: t, secret: "s3cret", answer: answer}
	server := httptest.NewServer(f)
	t.Cleanup(server.Close)
	tokenFile := filepath.Join(t.TempDir(), "sidecar-token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return NewClient(server.URL, tokenFile), f, tokenFile
}

func assignment(task string, token int) Assignment {
	return Assignment{
		Task: task, Namespace: "ns", Worker: "w", Attempt: 1, Token: token,
		LeaseDurationSeconds: 3, HeartbeatIntervalSeconds: 0.6,
		LeaseDeadline: time.Now().Add(3 * time.Second), LeaseRemainingSeconds: 3,
		State: AssignmentStateActive,
	}
}

func TestEveryCallCarriesTheSecretAndARestartedSidecarsNewOneIsPickedUp(t *testing.T) {
	client, f, tokenFile := setup(t, func(r *http.Request, body map[string]any) (int, any) {
		return 200, assignment("t1", 7)
	})
	if _, err := client.Get(context.Background(), "t1"); err != nil {
		t.Fatal(err)
	}
	// The sidecar restarts with a new secret: the first call with the old one is sent again.
	f.mu.Lock()
	f.secret = "n3w"
	f.mu.Unlock()
	if err := os.WriteFile(tokenFile, []byte("n3w"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Get(context.Background(), "t1"); err != nil {
		t.Fatal(err)
	}
	// A wrong secret that does not change is a 401, at once.
	f.mu.Lock()
	f.secret = "other"
	f.mu.Unlock()
	_, err := client.Get(context.Background(), "t1")
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 401 || apiErr.Code() != "Unauthorized" {
		t.Fatalf("want a 401, got %v", err)
	}
}

func TestAMissingTokenFileIsUnavailableNotFatal(t *testing.T) {
	client := NewClient("http://127.0.0.1:1", filepath.Join(t.TempDir(), "not-yet"))
	_, err := client.Get(context.Background(), "t1")
	if !IsUnavailable(err) {
		t.Fatalf("want unavailable, got %v", err)
	}
}

func TestOffersLongPollsForNewAttemptsOnlyAndHandsEachOutOnce(t *testing.T) {
	var mu sync.Mutex
	listings := 0
	client, f, _ := setup(t, func(r *http.Request, body map[string]any) (int, any) {
		mu.Lock()
		defer mu.Unlock()
		listings++
		switch listings {
		case 1:
			return 200, AssignmentList{Worker: "w", Namespace: "ns", Version: 3,
				Assignments: []Assignment{assignment("a", 10)}}
		case 2: // a 503 (the sidecar restarting): waited out, the next listing from scratch
			return 503, Error{Error: "NotReady", Message: "starting"}
		case 3:
			reported := assignment("b", 12)
			reported.State = AssignmentStateReported
			return 200, AssignmentList{Worker: "w", Namespace: "ns", Version: 1,
				Assignments: []Assignment{assignment("a", 10), assignment("a", 11), reported}}
		default:
			return 200, AssignmentList{Worker: "w", Namespace: "ns", Version: 1}
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	var got []Assignment
	err := client.Offers(ctx, 0.01, func(a Assignment) {
		got = append(got, a)
		if len(got) == 2 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Offers returned %v", err)
	}
	if len(got) != 2 || got[0].Token != 10 || got[1].Token != 11 {
		t.Fatalf("offered %+v", got)
	}
	calls := f.recorded()
	if calls[0].Query != "wait=0.01" {
		t.Errorf("first listing %q", calls[0].Query)
	}
	if calls[1].Query != "after=3&until=offers&wait=0.01" {
		t.Errorf("second listing %q", calls[1].Query)
	}
	if calls[2].Query != "wait=0.01" {
		t.Errorf("after a 503 the listing starts over: %q", calls[2].Query)
	}
}

func TestALeaseBeatsWithProgressOnlyWhenItChangedAndStopsAtA409(t *testing.T) {
	var mu sync.Mutex
	beats := 0
	client, f, _ := setup(t, func(r *http.Request, body map[string]any) (int, any) {
		mu.Lock()
		defer mu.Unlock()
		beats++
		if beats >= 4 {
			return 409, Error{Error: "LeaseLost", Message: "its Lease was deleted"}
		}
		return 200, assignment("t1", 7)
	})
	a := assignment("t1", 7)
	a.HeartbeatIntervalSeconds = 0.3 // beats every 100 ms
	lease, err := client.Hold(context.Background(), a, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Close()
	if err := lease.Progress("step 1"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for lease.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	lost, ok := AsLost(lease.Err())
	if !ok || lost.Code() != "LeaseLost" {
		t.Fatalf("want LeaseLost, got %v", lease.Err())
	}
	if err := lease.Progress("step 2"); err == nil {
		t.Fatal("Progress after a 409 returned nil")
	}
	calls := f.recorded()
	if len(calls) != 4 {
		t.Fatalf("%d beats after the 409: %+v", len(calls), calls)
	}
	if calls[0].Path != "/v1/assignments/t1/heartbeat" || calls[0].Body["token"] != float64(7) {
		t.Errorf("first beat %+v", calls[0])
	}
	if _, has := calls[0].Body["progress"]; has {
		t.Errorf("no progress yet, but sent: %+v", calls[0])
	}
	if calls[1].Body["progress"] != "step 1" {
		t.Errorf("second beat %+v", calls[1])
	}
	if _, has := calls[2].Body["progress"]; has {
		t.Errorf("unchanged progress sent again: %+v", calls[2])
	}
	// The report still asks the sidecar, which answers 409 too.
	if _, err := lease.Complete(context.Background(), 1, nil); err == nil {
		t.Fatal("Complete after the 409 returned nil")
	}
}

func TestARevokedClaimCallsOnRevokeWithTheFenceTokenOnce(t *testing.T) {
	fence := 8
	client, _, _ := setup(t, func(r *http.Request, body map[string]any) (int, any) {
		return 409, Error{Error: "Cancelled", Message: "cancelled", FenceToken: &fence}
	})
	var fenced []int64
	_, err := client.Hold(context.Background(), assignment("t1", 7), func(f int64) { fenced = append(fenced, f) })
	lost, ok := AsLost(err)
	if !ok || !lost.Revoked() || lost.FenceToken() != 8 {
		t.Fatalf("want Cancelled with fence 8, got %v", err)
	}
	if len(fenced) != 1 || fenced[0] != 8 {
		t.Fatalf("onRevoke calls: %v", fenced)
	}
}

func TestReportsAreSentAgainWhileTheSidecarCannotTakeThem(t *testing.T) {
	var mu sync.Mutex
	reports := 0
	client, f, _ := setup(t, func(r *http.Request, body map[string]any) (int, any) {
		if r.URL.Path == "/v1/assignments/t1/heartbeat" {
			return 200, assignment("t1", 7)
		}
		mu.Lock()
		defer mu.Unlock()
		reports++
		if reports == 1 {
			return 503, Error{Error: "ApiUnavailable", Message: "the API server did not take it"}
		}
		return 200, ReportAccepted{Task: "t1", Token: 7, State: ReportAcceptedStateReported}
	})
	lease, err := client.Hold(context.Background(), assignment("t1", 7), nil)
	if err != nil {
		t.Fatal(err)
	}
	answer, err := lease.Fail(context.Background(), "ToolError", "boom", false)
	if err != nil || answer.State != ReportAcceptedStateReported {
		t.Fatalf("Fail: %+v %v", answer, err)
	}
	var sent []call
	for _, c := range f.recorded() {
		if c.Path == "/v1/assignments/t1/fail" {
			sent = append(sent, c)
		}
	}
	if len(sent) != 2 || sent[1].Body["reason"] != "ToolError" || sent[1].Body["retryable"] != false {
		t.Fatalf("fail requests: %+v", sent)
	}
}
