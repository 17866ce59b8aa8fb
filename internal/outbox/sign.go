package outbox

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"sync"
)

// DecodeSecret decodes a Standard Webhooks signing secret: "whsec_" followed by base64 of 24 to
// 64 random bytes (the prefix may be left out).
func DecodeSecret(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return nil, errors.New("outbox: T3CODE_MCP_HOOK_SECRET is not a Standard Webhooks secret: want whsec_ followed by base64")
	}
	if len(key) < 24 || len(key) > 64 {
		return nil, fmt.Errorf("outbox: T3CODE_MCP_HOOK_SECRET decodes to %d bytes; Standard Webhooks secrets are 24 to 64 random bytes", len(key))
	}
	return key, nil
}

// Sign returns the webhook-signature header value for one request: "v1," and the base64
// HMAC-SHA256, keyed with the decoded secret, of "<id>.<timestamp>.<body>".
func Sign(key []byte, id string, timestamp int64, body []byte) string {
	return newSigner(key).sign(id, timestamp, body)
}

// signer signs with one key. Its HMAC states are reused (a pool, one per request in flight):
// hmac.New for every request allocated two SHA-256 states, the key's pads and the buffers around
// them for each delivery.
type signer struct {
	key  []byte
	pool sync.Pool // *signState
}

type signState struct {
	mac     hash.Hash
	scratch []byte // "<id>.<timestamp>.", then the sum
}

func newSigner(key []byte) *signer { return &signer{key: key} }

func (s *signer) sign(id string, timestamp int64, body []byte) string {
	st, _ := s.pool.Get().(*signState)
	if st == nil {
		st = &signState{mac: hmac.New(sha256.New, s.key), scratch: make([]byte, 0, 128)}
	} else {
		st.mac.Reset()
	}
	b := append(st.scratch[:0], id...)
	b = append(b, '.')
	b = strconv.AppendInt(b, timestamp, 10)
	b = append(b, '.')
	st.mac.Write(b)
	st.mac.Write(body)
	b = st.mac.Sum(b[:0])
	out := make([]byte, 0, len("v1,")+base64.StdEncoding.EncodedLen(len(b)))
	out = base64.StdEncoding.AppendEncode(append(out, "v1,"...), b)
	st.scratch = b
	s.pool.Put(st)
	return string(out)
}
