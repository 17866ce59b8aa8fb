package outbox

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestSignerReusesStatesCorrectly: one signer's pooled HMAC states, reused across requests and
// goroutines, sign every message as a fresh HMAC does (the spec's vector among them), whatever
// the previous message's length (checked by the independent verifier, verify).
func TestSignerReusesStatesCorrectly(t *testing.T) {
	key, err := DecodeSecret(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	s := newSigner(key)
	if got, want := s.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, []byte(`{"test": 2432232314}`)), "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Fatalf("sign = %s, want %s", got, want)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				id := fmt.Sprintf("evt_%d_%0*d", g, i%40, i)
				body := fmt.Appendf(nil, `{"n":%d,"pad":"%0*d"}`, i, i*7%300, 0)
				ts := int64(1795942365 + i)
				hdr := http.Header{}
				hdr.Set("webhook-id", id)
				hdr.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
				hdr.Set("webhook-signature", s.sign(id, ts, body))
				if err := verify(testSecret, hdr, body, time.Unix(ts, 0)); err != nil {
					t.Errorf("sign(%s): %v", id, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkSign: one webhook-signature of a typical event body, with a fresh HMAC per request
// (Sign, as before the signer) and with the outbox's signer (pooled states).
func BenchmarkSign(b *testing.B) {
	key, err := DecodeSecret(testSecret)
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"id":"evt_3f1c9a0e5b7d2c4a6e8f0b1d","type":"thread.completed","occurred_at":"2026-11-29T08:52:43Z","machine":"mac","project":{"id":"project-006c84f3","title":"api"},"thread_id":"thread-edec8901","run_id":"run:thread:thread-edec8901:ordinal:1","title":"Fix the flaky test","summary":"Each test case now gets its own temp dir; go test ./... passes."}`)
	b.Run("fresh", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = Sign(key, "evt_3f1c9a0e5b7d2c4a6e8f0b1d", 1795942365, body)
		}
	})
	b.Run("signer", func(b *testing.B) {
		s := newSigner(key)
		b.ReportAllocs()
		for b.Loop() {
			_ = s.sign("evt_3f1c9a0e5b7d2c4a6e8f0b1d", 1795942365, body)
		}
	})
}
