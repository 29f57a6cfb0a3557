// Package sidecar is a small Go client of agentq's agent API: the local HTTP API that
// `agentq sidecar` serves to the agent in the same pod (docs/agent-api.md).
//
//	client := sidecar.NewClient("", "")  // $AGENTQ_SIDECAR_URL, $AGENTQ_SIDECAR_TOKEN_FILE
//	err := client.Offers(ctx, 30, func(a sidecar.Assignment) {
//		lease, err := client.Hold(ctx, a, nil)  // beats now, then from a goroutine
//		if err != nil { return }               // a 409: another attempt owns the task
//		defer lease.Close()
//		lease.Progress("step 1/3")              // returns the 409 once the lease is lost
//		lease.Complete(ctx, map[string]any{"answer": 42}, nil)
//	})
//
// The request and response types (types.gen.go) are generated from
// docs/agent-api.openapi.yaml by oapi-codegen; `make polyglot-generate` writes them
// again and the tests fail when they are out of date.
//
// Every call carries the sidecar's secret as `Authorization: Bearer`, read from its
// token file for every request (a restarted sidecar writes a new one); a 401 answered
// to a secret that has since changed is sent again once with the new one.
package sidecar

//go:generate sh ../../generate.sh

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

const (
	// DefaultURL is where the sidecar serves unless told otherwise.
	DefaultURL = "http://127.0.0.1:8700"
	// DefaultTokenFile is where the sidecar writes its secret in an agent pod.
	DefaultTokenFile = "/run/agentq/sidecar-token"
	// URLEnv and TokenFileEnv override the defaults.
	URLEnv       = "AGENTQ_SIDECAR_URL"
	TokenFileEnv = "AGENTQ_SIDECAR_TOKEN_FILE"
	// seenMemory is how many attempts Offers remembers having handed out.
	seenMemory = 4096
)

// Client calls one sidecar. It is safe for concurrent use.
type Client struct {
	URL       string
	TokenFile string
	HTTP      *http.Client
	// Timeout bounds a request that is not a long poll (a long poll gets its wait on top).
	Timeout time.Duration
}

// NewClient returns a client of the sidecar at url with the secret in tokenFile; an
// empty argument takes $AGENTQ_SIDECAR_URL / $AGENTQ_SIDECAR_TOKEN_FILE, else the default.
func NewClient(url, tokenFile string) *Client {
	if url == "" {
		url = os.Getenv(URLEnv)
	}
	if url == "" {
		url = DefaultURL
	}
	if tokenFile == "" {
		tokenFile = os.Getenv(TokenFileEnv)
	}
	if tokenFile == "" {
		tokenFile = DefaultTokenFile
	}
	return &Client{
		URL:       strings.TrimRight(url, "/"),
		TokenFile: tokenFile,
		HTTP:      &http.Client{},
		Timeout:   30 * time.Second,
	}
}

// APIError is the sidecar's refusal of a request: its status and its JSON body.
type APIError struct {
	Status int
	Body   Error
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Status, e.Body.Error, e.Body.Message)
}

// Code is the body's error code (LeaseLost, StaleToken, Cancelled, ...).
func (e *APIError) Code() string { return e.Body.Error }

// Lost says the attempt is no longer this agent's (409: LeaseLost, StaleToken,
// AttemptEnded, AlreadyReported, Cancelled, DeadlineExceeded): stop working on it.
func (e *APIError) Lost() bool { return e.Status == http.StatusConflict }

// Revoked says the operator revoked the claim (a cancel, a deadline). FenceToken is
// then above the attempt's token: fence the keys the attempt writes with it.
func (e *APIError) Revoked() bool {
	return e.Lost() && (e.Body.Error == "Cancelled" || e.Body.Error == "DeadlineExceeded")
}

// FenceToken is the revocation's fence (0 when there is none).
func (e *APIError) FenceToken() int64 {
	if e.Body.FenceToken == nil {
		return 0
	}
	return int64(*e.Body.FenceToken)
}

// UnavailableError: the sidecar could not be reached, or answered 5xx (starting, not
// ready, shutting down, the API server away): try again shortly.
type UnavailableError struct{ Err error }

func (e *UnavailableError) Error() string { return "sidecar unavailable: " + e.Err.Error() }
func (e *UnavailableError) Unwrap() error { return e.Err }

// AsLost returns the 409 in err, if it is one.
func AsLost(err error) (*APIError, bool) {
	var apiErr *APIError
	if errors.As(err, &apiErr) && apiErr.Lost() {
		return apiErr, true
	}
	return nil, false
}

// IsUnavailable says whether err is worth retrying as it is.
func IsUnavailable(err error) bool {
	var unavailable *UnavailableError
	return errors.As(err, &unavailable)
}

func (c *Client) secret() (string, error) {
	data, err := os.ReadFile(c.TokenFile)
	if err != nil {
		// Not written yet (the sidecar is starting): like a sidecar that does not answer.
		return "", &UnavailableError{fmt.Errorf("reading the secret: %w", err)}
	}
	return strings.TrimSpace(string(data)), nil
}

// do sends one request and decodes a 200's JSON into out.
func (c *Client) do(ctx context.Context, method, path string, wait time.Duration, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	for try := 0; ; try++ {
		secret, err := c.secret()
		if err != nil {
			return err
		}
		status, data, err := c.send(ctx, method, path, wait, secret, body)
		if err != nil {
			return err
		}
		if status == http.StatusOK {
			if out == nil {
				return nil
			}
			return json.Unmarshal(data, out)
		}
		apiErr := &APIError{Status: status}
		if json.Unmarshal(data, &apiErr.Body) != nil || apiErr.Body.Error == "" {
			apiErr.Body = Error{Error: http.StatusText(status), Message: string(data)}
		}
		if status == http.StatusUnauthorized && try == 0 {
			if now, err := c.secret(); err == nil && now != secret {
				continue // the sidecar restarted meanwhile: once more with its new secret
			}
		}
		if status >= 500 {
			return &UnavailableError{apiErr}
		}
		return apiErr
	}
}

func (c *Client) send(
	ctx context.Context, method, path string, wait time.Duration, secret string, body []byte,
) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout+wait)
	defer cancel()
	var reader io.Reader
	if body != nil {
		reader = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.URL+path, reader)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+secret)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			return 0, nil, err
		}
		return 0, nil, &UnavailableError{err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return 0, nil, &UnavailableError{err}
	}
	return resp.StatusCode, data, nil
}

func taskPath(task, verb string) string {
	path := "/v1/assignments/" + url.PathEscape(task)
	if verb != "" {
		path += "/" + verb
	}
	return path
}

// List returns the worker's assignments; with params.Wait, a long poll
// (GET /v1/assignments).
func (c *Client) List(ctx context.Context, params ListAssignmentsParams) (*AssignmentList, error) {
	query := url.Values{}
	var wait time.Duration
	if params.Wait != nil {
		query.Set("wait", strconv.FormatFloat(float64(*params.Wait), 'f', -1, 32))
		wait = time.Duration(float64(*params.Wait) * float64(time.Second))
	}
	if params.After != nil {
		query.Set("after", strconv.Itoa(*params.After))
	}
	if params.Until != nil {
		query.Set("until", string(*params.Until))
	}
	path := "/v1/assignments"
	if len(query) > 0 {
		path += "?" + query.Encode()
	}
	var out AssignmentList
	if err := c.do(ctx, http.MethodGet, path, wait, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Get returns the current attempt of one task (GET /v1/assignments/{task}).
func (c *Client) Get(ctx context.Context, task string) (*Assignment, error) {
	var out Assignment
	if err := c.do(ctx, http.MethodGet, taskPath(task, ""), 0, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Heartbeat says the agent works on the attempt, with an optional progress marker.
func (c *Client) Heartbeat(ctx context.Context, task string, body HeartbeatRequest) (*Assignment, error) {
	var out Assignment
	if err := c.do(ctx, http.MethodPost, taskPath(task, "heartbeat"), 0, body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Complete reports success (200 once the report is on the Lease).
func (c *Client) Complete(ctx context.Context, task string, body CompleteRequest) (*ReportAccepted, error) {
	var out ReportAccepted
	if err := c.do(ctx, http.MethodPost, taskPath(task, "complete"), 0, body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Fail reports failure; Retryable false ends the task Failed at once.
func (c *Client) Fail(ctx context.Context, task string, body FailRequest) (*ReportAccepted, error) {
	var out ReportAccepted
	if err := c.do(ctx, http.MethodPost, taskPath(task, "fail"), 0, body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Status is what the sidecar is doing (GET /v1/status).
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var out Status
	if err := c.do(ctx, http.MethodGet, "/v1/status", 0, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Offers calls fn with every new attempt granted to this worker, once each, as they
// come, until ctx ends (then it returns ctx's error) or the sidecar refuses the
// listing for good (a 4xx, e.g. 401 for a wrong secret). A sidecar that is starting,
// unreachable or failing (5xx) is waited out. After the first listing it long-polls
// with until=offers: a report or a heartbeat does not end its wait.
func (c *Client) Offers(ctx context.Context, poll float32, fn func(Assignment)) error {
	type attempt struct {
		task  string
		token Token
	}
	seen := map[attempt]bool{}
	var order []attempt
	var version *int
	for ctx.Err() == nil {
		params := ListAssignmentsParams{Wait: &poll}
		if version != nil {
			until := Offers
			params.After, params.Until = version, &until
		}
		list, err := c.List(ctx, params)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if !IsUnavailable(err) {
				return err
			}
			version = nil // a restarted sidecar counts its versions anew
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
			continue
		}
		v := list.Version
		version = &v
		for _, a := range list.Assignments {
			key := attempt{a.Task, a.Token}
			if a.State != AssignmentStateActive || seen[key] {
				continue
			}
			seen[key] = true
			order = append(order, key)
			if len(order) > seenMemory { // tokens are never reused: forgetting the oldest is safe
				delete(seen, order[0])
				order = order[1:]
			}
			fn(a)
		}
	}
	return ctx.Err()
}
