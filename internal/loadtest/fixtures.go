package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// Fixtures for the Go benchmarks: wire bytes made by t3fake, so their shapes are the ones the
// recordings in testdata/t3 pin, at sizes the recordings do not reach.

// Prompt is the prompt of every scripted run the harness and the fixtures start: a realistic
// length (the fake's reply quotes its first 60 characters).
const Prompt = "Fix the flaky test in the payment service: the retry loop asserts before the ledger has settled, " +
	"so make it wait for the settlement event and run the whole suite afterwards."

// ThreadBody returns the body of GET /api/orchestration/threads/{id} (a ThreadSnapshot) for a
// thread that ran runs default-script runs: five turn items per run (user message, command,
// file change, assistant reply, checkpoint), two messages and a checkpoint record each. runs =
// 1000 gives the 5,000-item thread of the benchmarks.
func ThreadBody(ctx context.Context, runs int) (body []byte, threadID string, err error) {
	fk, err := t3fake.New(t3fake.Options{Label: "fixture", ManualSteps: true, KeepRuns: -1})
	if err != nil {
		return nil, "", err
	}
	defer fk.Close()
	pid := fk.AddProject("payments", "/srv/payments")
	tid := fk.AddThread(pid, "Fix the flaky payment test", "idle")
	for i := 0; i < runs; i++ {
		if _, err := fk.StartRun(tid, fmt.Sprintf("%s (attempt %d)", Prompt, i+1)); err != nil {
			return nil, "", err
		}
		fk.StepAll()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fk.URL()+"/api/orchestration/threads/"+tid, nil)
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Authorization", "Bearer "+fk.Token())
	req.Header.Set("x-t3-orchestration-protocol", "2")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer res.Body.Close()
	body, err = io.ReadAll(res.Body)
	if err != nil {
		return nil, "", err
	}
	if res.StatusCode != http.StatusOK {
		return nil, "", fmt.Errorf("GET thread: %s: %s", res.Status, body)
	}
	return body, tid, nil
}

// ProjectionJSON extracts the projection object from a ThreadSnapshot body.
func ProjectionJSON(snapshot []byte) ([]byte, error) {
	var out []byte
	err := jx.DecodeBytes(snapshot).ObjBytes(func(d *jx.Decoder, k []byte) error {
		if string(k) != "projection" {
			return d.Skip()
		}
		raw, err := d.Raw()
		out = append([]byte(nil), raw...)
		return err
	})
	if err == nil && out == nil {
		err = errors.New("no projection in the snapshot")
	}
	return out, err
}

var errStop = errors.New("stop")

// ShellSnapshotItem returns the first item of orchestration.subscribeShell (kind snapshot) of a
// machine with threads threads, each of which has finished one default-script run, so every row
// carries the fields a busy machine's rows carry (latest run, timestamps, last visible message).
// It is read through a real socket with the connector's own client.
func ShellSnapshotItem(ctx context.Context, threads int) ([]byte, error) {
	fk, err := t3fake.New(t3fake.Options{Label: "fixture", ManualSteps: true})
	if err != nil {
		return nil, err
	}
	defer fk.Close()
	pid := fk.AddProject("payments", "/srv/payments")
	for i := 0; i < threads; i++ {
		tid := fk.AddThread(pid, fmt.Sprintf("Load thread %d: fix the flaky payment test", i), "idle")
		if _, err := fk.StartRun(tid, Prompt); err != nil {
			return nil, err
		}
	}
	fk.StepAll()
	c, err := t3.NewClient("fixture", fk.URL(), fk.Token(), t3.Options{})
	if err != nil {
		return nil, err
	}
	conn, err := c.DialRPC(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var item []byte
	err = conn.Stream(ctx, "orchestration.subscribeShell", &t3rpc.SubscribeShellInput{}, func(values []jx.Raw) error {
		item = append([]byte(nil), values[0]...)
		return errStop
	})
	if !errors.Is(err, errStop) {
		return nil, fmt.Errorf("subscribeShell: %v", err)
	}
	return item, nil
}
