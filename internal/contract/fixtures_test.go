package contract

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// fixturesDir holds the recorded T3 traffic (testdata/t3/README.md describes the files).
const fixturesDir = "../../testdata/t3"

// recording is one fixture file: HTTP exchanges and, for WebSocket sessions, frames in order.
type recording struct {
	file      string
	Exchanges []exchange `json:"exchanges"`
	Frames    []frame    `json:"frames"`
}

type exchange struct {
	Name            string            `json:"name"`
	Method          string            `json:"method"`
	URL             string            `json:"url"`
	Status          int               `json:"status"`
	ResponseHeaders map[string]string `json:"responseHeaders"`
	// ResponseBody is the raw body text (a JSON string) in recordings, a JSON value in the
	// synthetic file, or absent.
	ResponseBody json.RawMessage `json:"responseBody"`
}

// body returns the response body bytes.
func (e exchange) body() ([]byte, error) {
	raw := bytes.TrimSpace(e.ResponseBody)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return nil, nil
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return []byte(s), nil
	default:
		return raw, nil
	}
}

func (e exchange) String() string {
	if e.Name != "" {
		return fmt.Sprintf("%s %s %d (%s)", e.Method, e.URL, e.Status, e.Name)
	}
	return fmt.Sprintf("%s %s %d", e.Method, e.URL, e.Status)
}

type frame struct {
	Dir  string `json:"dir"` // send (client to server), recv, or event (socket open/close notes)
	Data string `json:"data"`
}

var (
	recordingsOnce sync.Once
	recordings     []recording
	recordingsErr  error
)

// loadRecordings reads every fixture file once: t3-v2-pr2829/*.json and t3-v2-gate-synthetic.json.
func loadRecordings(t testing.TB) []recording {
	t.Helper()
	recordingsOnce.Do(func() {
		files, err := filepath.Glob(filepath.Join(fixturesDir, "t3-v2-pr2829", "*.json"))
		if err != nil {
			recordingsErr = err
			return
		}
		files = append(files, filepath.Join(fixturesDir, "t3-v2-gate-synthetic.json"))
		sort.Strings(files)
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				recordingsErr = err
				return
			}
			var r recording
			if err := json.Unmarshal(data, &r); err != nil {
				recordingsErr = fmt.Errorf("%s: %w", f, err)
				return
			}
			r.file = filepath.ToSlash(strings.TrimPrefix(f, fixturesDir+string(filepath.Separator)))
			recordings = append(recordings, r)
		}
	})
	if recordingsErr != nil {
		t.Fatalf("load fixtures: %v", recordingsErr)
	}
	if len(recordings) < 2 {
		t.Fatalf("found %d fixture files under %s", len(recordings), fixturesDir)
	}
	return recordings
}

// splitFrame returns the messages of one WebSocket frame: a frame holds one JSON message or a JSON
// array of messages.
func splitFrame(data []byte) ([]json.RawMessage, error) {
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '[' {
		var msgs []json.RawMessage
		if err := json.Unmarshal(data, &msgs); err != nil {
			return nil, err
		}
		return msgs, nil
	}
	if !json.Valid(data) {
		return nil, fmt.Errorf("frame is not JSON: %.80q", data)
	}
	return []json.RawMessage{data}, nil
}

// requestKey is a request id as text: T3 echoes ids verbatim, numbers and strings alike.
func requestKey(id t3rpc.RequestId) string {
	if s, ok := id.GetString(); ok {
		return s
	}
	if n, ok := id.GetInt64(); ok {
		return strconv.FormatInt(n, 10)
	}
	return "?"
}

// decoder is what every generated type offers; Validate is called too when the type has it.
type decoder interface{ UnmarshalJSON([]byte) error }

type validator interface{ Validate() error }

func decode(v decoder, data []byte) error {
	if err := v.UnmarshalJSON(data); err != nil {
		return err
	}
	if vv, ok := v.(validator); ok {
		if err := vv.Validate(); err != nil {
			return fmt.Errorf("validate: %w", err)
		}
	}
	return nil
}

// counter counts decoded items per category, so a test can show that nothing was skipped silently.
type counter map[string]int

func (c counter) add(category string) { c[category]++ }

// requirePositive fails for each category that decoded nothing.
func (c counter) requirePositive(t *testing.T, categories ...string) {
	t.Helper()
	for _, cat := range categories {
		if c[cat] == 0 {
			t.Errorf("no recorded item decoded as %s: a category went missing (fixtures or routing changed?)", cat)
		}
	}
}

func (c counter) log(t *testing.T) {
	t.Helper()
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %-60s %d", k, c[k])
	}
	t.Logf("decoded:%s", b.String())
}
