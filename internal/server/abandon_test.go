package server

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestToolCallIDs: the ids of tools/call requests in a POST body, one message
// or a batch; notifications, other methods and malformed bodies give none.
func TestToolCallIDs(t *testing.T) {
	for body, want := range map[string]string{
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t3_wait"}}`:                                                                     `7`,
		`{"jsonrpc":"2.0","id":"a-1","method":"tools/call"}`:                                                                                             `"a-1"`,
		`[{"jsonrpc":"2.0","id":1,"method":"tools/call"},{"jsonrpc":"2.0","id":2,"method":"tools/list"},{"jsonrpc":"2.0","id":3,"method":"tools/call"}]`: `1,3`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}`:                                                                  ``,
		`{"jsonrpc":"2.0","id":null,"method":"tools/call"}`:                                                                                              ``,
		`{"jsonrpc":"2.0","id":4,"method":"initialize"}`:                                                                                                 ``,
		`not json`: ``,
		``:         ``,
	} {
		var got []string
		for _, id := range toolCallIDs([]byte(body)) {
			got = append(got, string(id))
		}
		if strings.Join(got, ",") != want {
			t.Errorf("%s: ids %v, want %s", body, got, want)
		}
	}
}

// FuzzToolCallIDs: any POST body is read without a panic, and every id found
// is valid JSON that a cancel notification can carry back.
func FuzzToolCallIDs(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t3_wait","arguments":{"thread_id":"t"}}}`))
	f.Add([]byte(`[{"jsonrpc":"2.0","id":"x","method":"tools/call"},{"jsonrpc":"2.0","method":"notifications/initialized"}]`))
	f.Add([]byte(`{"id":{"nested":true},"method":"tools/call"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, id := range toolCallIDs(body) {
			if !json.Valid(id) {
				t.Fatalf("id %q is not JSON", id)
			}
			if _, err := json.Marshal(map[string]any{"requestId": id}); err != nil {
				t.Fatalf("id %q cannot be sent back: %v", id, err)
			}
		}
	})
}
