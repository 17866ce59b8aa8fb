package outbox

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(strconv.FormatInt(timestamp, 10)))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}
