// Command agent is an agentq agent in Go: it takes its sidecar's assignments, beats
// with progress while it works, writes its output to a fenced SQLite sink and reports.
//
//	agent [--sidecar URL] [--token-file FILE] [--sink sqlite:///path.db] [--poll 30]
//	      [--step-seconds S]
//
// What it does with an attempt is told by the task's payload (every field optional):
//
//	{"action": "complete" | "fail" | "fatal" | "hold",  // default complete
//	 "steps": 3, "stepSeconds": 0.2,                   // the work: steps with progress "step i/n"
//	 "blocking": false,                                 // true: the steps check nothing (a long model call)
//	 "reason": "AgentError", "message": "..."}          // for fail (retryable) and fatal (not)
//
// --step-seconds overrides the payload's stepSeconds (a slower or a faster agent).
// hold beats with a new progress marker every beat until the claim is lost or revoked.
// With --sink it fences the task's key with its token as it starts, writes its output
// there when the work is done, and fences the key with the revocation's token when the
// operator revokes the claim (a cancel). A write refused by the fence means a newer
// attempt owns the task: the work is discarded and the sidecar asked, which answers 409.
//
// Every event is one JSON line on stdout (started, assigned, sink-fenced, sink-written,
// sink-refused, reported, lost, revoked, error), for tests and people to read.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"agentq.dev/examples/agents/go/fencing"
	"agentq.dev/examples/agents/go/sidecar"
)

var printLock sync.Mutex

func emit(event string, fields map[string]any) {
	line := map[string]any{"event": event, "lang": "go"}
	for k, v := range fields {
		line[k] = v
	}
	data, _ := json.Marshal(line)
	printLock.Lock()
	defer printLock.Unlock()
	fmt.Println(string(data))
}

// Payload is what a task's spec.payload tells this agent to do.
type Payload struct {
	Action      string  `json:"action"`
	Steps       int     `json:"steps"`
	StepSeconds float64 `json:"stepSeconds"`
	Blocking    bool    `json:"blocking"`
	Reason      string  `json:"reason"`
	Message     string  `json:"message"`
}

func parsePayload(raw any) (Payload, error) {
	p := Payload{Action: "complete", Steps: 3, StepSeconds: 0.2, Reason: "AgentError", Message: "failed on purpose"}
	if raw == nil {
		return p, nil
	}
	data, err := json.Marshal(raw)
	if err != nil {
		return p, err
	}
	if err := json.Unmarshal(data, &p); err != nil {
		return p, fmt.Errorf("payload: %w", err)
	}
	switch p.Action {
	case "complete", "fail", "fatal", "hold":
	default:
		return p, fmt.Errorf("payload: unknown action %q", p.Action)
	}
	return p, nil
}

type agent struct {
	client      *sidecar.Client
	sink        *fencing.Store
	stepSeconds float64 // overrides the payload's when >= 0
}

func main() {
	url := flag.String("sidecar", "", "the sidecar's agent API [$AGENTQ_SIDECAR_URL; default "+sidecar.DefaultURL+"]")
	tokenFile := flag.String("token-file", "", "the sidecar's token file [$AGENTQ_SIDECAR_TOKEN_FILE; default "+sidecar.DefaultTokenFile+"]")
	sinkURL := flag.String("sink", os.Getenv("AGENTQ_SINK"), "fenced sink: sqlite:///path.db [$AGENTQ_SINK]")
	poll := flag.Float64("poll", 30, "long-poll seconds")
	stepSeconds := flag.Float64("step-seconds", -1, "override the payload's stepSeconds")
	flag.Parse()

	a := &agent{client: sidecar.NewClient(*url, *tokenFile), stepSeconds: *stepSeconds}
	if *sinkURL != "" {
		store, err := fencing.Open(*sinkURL)
		if err != nil {
			fmt.Fprintln(os.Stderr, "agent:", err)
			os.Exit(2)
		}
		defer store.Close()
		a.sink = store
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	emit("started", map[string]any{"sidecar": a.client.URL})
	var attempts sync.WaitGroup
	err := a.client.Offers(ctx, float32(*poll), func(as sidecar.Assignment) {
		emit("assigned", map[string]any{"task": as.Task, "token": as.Token, "attempt": as.Attempt})
		attempts.Add(1)
		go func() {
			defer attempts.Done()
			a.attempt(ctx, as)
		}()
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
	attempts.Wait()
}

// attempt works on one assignment and says how it ended.
func (a *agent) attempt(ctx context.Context, as sidecar.Assignment) {
	err := a.work(ctx, as)
	fields := map[string]any{"task": as.Task, "token": as.Token}
	if apiErr, lost := sidecar.AsLost(err); lost {
		fields["code"], fields["status"], fields["why"] = apiErr.Code(), apiErr.Status, apiErr.Error()
		if apiErr.Revoked() {
			fields["fence"] = apiErr.FenceToken()
			emit("revoked", fields)
		} else {
			emit("lost", fields)
		}
	} else if err != nil && !errors.Is(err, context.Canceled) {
		fields["why"] = err.Error()
		emit("error", fields)
	}
}

func (a *agent) work(ctx context.Context, as sidecar.Assignment) error {
	p, err := parsePayload(as.Payload)
	if err != nil {
		return err
	}
	if a.stepSeconds >= 0 {
		p.StepSeconds = a.stepSeconds
	}
	token := int64(as.Token)
	var onRevoke func(int64)
	if a.sink != nil {
		// A revoked claim has no next attempt whose writes would fence ours: the
		// revocation's token does it, so this attempt's own later writes are refused.
		onRevoke = func(fence int64) {
			if rec, err := a.sink.Fence(context.Background(), as.Task, fence); err == nil {
				emit("sink-fenced", map[string]any{"task": as.Task, "token": fence, "revision": rec.Revision, "why": "revoked"})
			}
		}
	}
	lease, err := a.client.Hold(ctx, as, onRevoke)
	if err != nil {
		return err
	}
	defer lease.Close()

	if a.sink != nil {
		rec, err := a.sink.Fence(ctx, as.Task, token)
		if err != nil {
			return a.refused(ctx, lease, as, err)
		}
		emit("sink-fenced", map[string]any{"task": as.Task, "token": token, "revision": rec.Revision})
	}

	if p.Action == "hold" {
		for step := 1; ; step++ {
			if err := lease.Progress(fmt.Sprintf("step-%d", step)); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(lease.Period):
			}
		}
	}

	for step := 1; step <= p.Steps; step++ {
		if err := lease.Progress(fmt.Sprintf("step %d/%d", step, p.Steps)); err != nil && !p.Blocking {
			return err // lost: stop now (a blocking step would not have noticed)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(p.StepSeconds * float64(time.Second))):
		}
	}

	var ref *string
	if a.sink != nil {
		output := map[string]any{
			"task": as.Task, "token": token, "attempt": as.Attempt, "by": as.Worker,
			"lang": "go", "payload": as.Payload,
		}
		// Written even if the lease was lost meanwhile: the fence is what refuses a zombie.
		rec, err := a.sink.Write(ctx, as.Task, token, output)
		if err != nil {
			return a.refused(ctx, lease, as, err)
		}
		emit("sink-written", map[string]any{"task": as.Task, "token": token, "revision": rec.Revision})
		r := a.sink.Ref(as.Task)
		ref = &r
	}

	switch p.Action {
	case "complete":
		result := map[string]any{"by": as.Worker, "lang": "go", "steps": p.Steps}
		if _, err := lease.Complete(ctx, result, ref); err != nil {
			return err
		}
		emit("reported", map[string]any{"task": as.Task, "token": token, "outcome": "Succeeded"})
	default:
		retryable := p.Action == "fail"
		if _, err := lease.Fail(ctx, p.Reason, p.Message, retryable); err != nil {
			return err
		}
		emit("reported", map[string]any{
			"task": as.Task, "token": token, "outcome": "Failed", "retryable": retryable, "reason": p.Reason,
		})
	}
	return nil
}

// refused handles a sink write refused by the fence: a newer attempt owns the task.
// The work is discarded; the sidecar, asked, answers 409 (returned as the outcome).
func (a *agent) refused(ctx context.Context, lease *sidecar.Lease, as sidecar.Assignment, err error) error {
	var stale *fencing.StaleTokenError
	if !errors.As(err, &stale) {
		return err
	}
	emit("sink-refused", map[string]any{
		"task": as.Task, "token": stale.Token, "highest": stale.Highest, "why": stale.Error(),
	})
	if lost := lease.Check(ctx); lost != nil {
		return lost
	}
	return err
}
