package sidecar

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Lease heartbeats one attempt from a goroutine while the agent works on it.
//
// It beats at once (the first beat is what makes the task Running), then every third
// of the task's heartbeat interval, with the progress marker when it changed. A 409
// marks the lease lost: Err, Progress, Complete and Fail return it from then on (the
// reports still ask the sidecar, the only judge). A revoked claim (Cancelled,
// DeadlineExceeded) calls the onRevoke function given to Hold with the revocation's
// fence token, once, from whichever goroutine heard it first.
type Lease struct {
	client     *Client
	Assignment Assignment
	// Period is how often the goroutine beats.
	Period time.Duration

	mu       sync.Mutex
	progress *string
	sent     *string
	lost     error
	finished bool
	revoked  bool
	onRevoke func(fenceToken int64)
	deadline time.Time

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// Hold starts heartbeating assignment a. It returns the first beat's error (a 409: the
// attempt is already lost; the sidecar unavailable). Close the lease when done.
func (c *Client) Hold(ctx context.Context, a Assignment, onRevoke func(fenceToken int64)) (*Lease, error) {
	period := time.Duration(float64(a.HeartbeatIntervalSeconds) / 3 * float64(time.Second))
	if period < 100*time.Millisecond {
		period = 100 * time.Millisecond
	}
	remaining := time.Until(a.LeaseDeadline)
	if a.LeaseDeadline.IsZero() {
		remaining = time.Duration(float64(a.LeaseDurationSeconds) * float64(time.Second))
	}
	l := &Lease{
		client:     c,
		Assignment: a,
		Period:     period,
		onRevoke:   onRevoke,
		deadline:   time.Now().Add(remaining),
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
	}
	if err := l.beat(ctx); err != nil {
		close(l.done)
		return nil, err
	}
	go l.run()
	return l, nil
}

func (l *Lease) run() {
	defer close(l.done)
	ticker := time.NewTicker(l.Period)
	defer ticker.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-ticker.C:
			ctx, cancel := context.WithTimeout(context.Background(), l.client.Timeout)
			err := l.beat(ctx)
			cancel()
			if _, lost := AsLost(err); lost || l.Err() != nil {
				return
			}
		}
	}
}

// beat sends one heartbeat; a 409 marks the lease lost. While the sidecar cannot be
// reached the lease is kept until its deadline has passed: then the operator will
// have reclaimed it, and the lease is presumed lost.
func (l *Lease) beat(ctx context.Context) error {
	l.mu.Lock()
	if l.lost != nil {
		err := l.lost
		l.mu.Unlock()
		return err
	}
	if l.finished {
		l.mu.Unlock()
		return nil
	}
	body := HeartbeatRequest{Token: l.Assignment.Token}
	progress := l.progress
	if progress != nil && (l.sent == nil || *l.sent != *progress) {
		body.Progress = progress
	}
	l.mu.Unlock()

	answer, err := l.client.Heartbeat(ctx, l.Assignment.Task, body)
	if err == nil {
		l.mu.Lock()
		if body.Progress != nil {
			l.sent = body.Progress
		}
		l.deadline = answer.LeaseDeadline
		l.mu.Unlock()
		return nil
	}
	if apiErr, lost := AsLost(err); lost {
		l.markLost(apiErr)
		return apiErr
	}
	l.mu.Lock()
	presumed := time.Now().After(l.deadline)
	l.mu.Unlock()
	if presumed {
		lost := &APIError{Status: 0, Body: Error{
			Error:   "LeaseDeadlinePassed",
			Message: fmt.Sprintf("the sidecar was unreachable past the lease deadline: %v", err),
		}}
		l.markLost(lost)
		return lost
	}
	return err
}

func (l *Lease) markLost(err *APIError) {
	l.mu.Lock()
	if l.lost == nil {
		l.lost = err
	}
	fence := err.Revoked() && err.FenceToken() > 0 && !l.revoked && l.onRevoke != nil
	if fence {
		l.revoked = true
	}
	l.mu.Unlock()
	if fence {
		l.onRevoke(err.FenceToken())
	}
}

// Err is the 409 (an *APIError) once the lease is lost, else nil.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// Progress sets the marker the next heartbeat carries; it returns Err().
func (l *Lease) Progress(marker string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.progress = &marker
	return l.lost
}

// Check asks the sidecar now (a heartbeat): nil while the attempt is still ours.
func (l *Lease) Check(ctx context.Context) error {
	return l.beat(ctx)
}

// Complete reports success; a 409 is returned (and marks the lease lost). A report the
// sidecar cannot take yet (503) is sent again with backoff (it is idempotent) until
// ctx ends or the lease is lost.
func (l *Lease) Complete(ctx context.Context, result any, resultRef *string) (*ReportAccepted, error) {
	return l.report(ctx, func() (*ReportAccepted, error) {
		return l.client.Complete(ctx, l.Assignment.Task, CompleteRequest{
			Token: l.Assignment.Token, Result: result, ResultRef: resultRef,
		})
	})
}

// Fail reports failure: retryable lets another attempt try, else the task ends Failed.
func (l *Lease) Fail(ctx context.Context, reason, message string, retryable bool) (*ReportAccepted, error) {
	return l.report(ctx, func() (*ReportAccepted, error) {
		return l.client.Fail(ctx, l.Assignment.Task, FailRequest{
			Token: l.Assignment.Token, Reason: reason, Message: &message, Retryable: &retryable,
		})
	})
}

func (l *Lease) report(ctx context.Context, send func() (*ReportAccepted, error)) (*ReportAccepted, error) {
	delay := 500 * time.Millisecond
	for {
		answer, err := send()
		if err == nil {
			l.mu.Lock()
			l.finished = true
			l.mu.Unlock()
			l.Close()
			return answer, nil
		}
		if apiErr, lost := AsLost(err); lost {
			l.markLost(apiErr)
			return nil, apiErr
		}
		if !IsUnavailable(err) {
			return nil, err
		}
		if lost := l.Err(); lost != nil {
			return nil, lost
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(err, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(delay*2, 5*time.Second)
	}
}

// Close stops the heartbeats (and waits for the goroutine to end).
func (l *Lease) Close() {
	l.once.Do(func() { close(l.stop) })
	<-l.done
}
