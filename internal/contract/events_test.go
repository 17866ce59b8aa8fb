package contract

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/gen/events"
)

const eventsDoc = "../../docs/events.md"

// fencedBlocks returns the bodies of the ```lang blocks of a Markdown file.
func fencedBlocks(t *testing.T, path, lang string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?ms)^```" + regexp.QuoteMeta(lang) + "\n(.*?)^```")
	var out []string
	for _, m := range re.FindAllStringSubmatch(string(data), -1) {
		out = append(out, m[1])
	}
	return out
}

// checkEvent decodes body as events.Event and checks that encoding it gives the same JSON back.
func checkEvent(t *testing.T, where string, body []byte) events.Event {
	t.Helper()
	var ev events.Event
	if err := decode(&ev, body); err != nil {
		t.Errorf("%s: does not decode as events.Event: %v\n%s", where, err, body)
		return ev
	}
	enc, err := ev.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var orig, back any
	if err := json.Unmarshal(body, &orig); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(enc, &back); err != nil {
		t.Fatal(err)
	}
	if d := keyDiff("", orig, back); len(d) > 0 {
		t.Errorf("%s: events.Event loses or adds fields:\n  %s", where, strings.Join(d, "\n  "))
	} else if !reflect.DeepEqual(orig, back) {
		t.Errorf("%s: events.Event changes a value:\n%s\n%s", where, body, enc)
	}
	return ev
}

// TestEventDocExamples keeps docs/events.md true: every JSON example is a valid event that the
// generated type reproduces, every event type has an example, and the field table lists exactly
// the schema's fields.
func TestEventDocExamples(t *testing.T) {
	blocks := fencedBlocks(t, eventsDoc, "json")
	if len(blocks) == 0 {
		t.Fatal("docs/events.md has no JSON examples")
	}
	seen := map[events.EventType]bool{}
	for i, b := range blocks {
		ev := checkEvent(t, "docs/events.md example "+strconv.Itoa(i+1), []byte(b))
		seen[ev.Type] = true
	}
	for _, typ := range events.EventType("").AllValues() {
		if typ != events.EventTypeThreadInterrupted && !seen[typ] {
			t.Errorf("docs/events.md has no example of %s", typ)
		}
	}

	var schema struct {
		Properties map[string]any `json:"properties"`
	}
	data, err := os.ReadFile("../../schema/events/event.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &schema); err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(eventsDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, fieldsSection, _ := strings.Cut(string(doc), "## Fields")
	fieldsSection, _, _ = strings.Cut(fieldsSection, "\n## ")
	var documented []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|").FindAllStringSubmatch(fieldsSection, -1) {
		documented = append(documented, m[1])
	}
	var inSchema []string
	for k := range schema.Properties {
		inSchema = append(inSchema, k)
	}
	sort.Strings(documented)
	sort.Strings(inSchema)
	if !reflect.DeepEqual(documented, inSchema) {
		t.Errorf("docs/events.md field table %v, schema/events/event.json properties %v", documented, inSchema)
	}
}

// TestEventSignatureExample recomputes the worked Standard Webhooks example in docs/events.md:
// v1,base64(HMAC-SHA256(base64decode(secret after whsec_), "<id>.<timestamp>.<body>")).
func TestEventSignatureExample(t *testing.T) {
	var fields map[string]string
	for _, b := range fencedBlocks(t, eventsDoc, "text") {
		if !strings.Contains(b, "webhook-signature") {
			continue
		}
		fields = map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(b), "\n") {
			k, v, _ := strings.Cut(line, " ")
			fields[k] = strings.TrimSpace(v)
		}
	}
	if fields == nil {
		t.Fatal("docs/events.md has no signing example")
	}
	for _, k := range []string{"secret", "webhook-id", "webhook-timestamp", "body", "webhook-signature"} {
		if fields[k] == "" {
			t.Fatalf("signing example lacks %s", k)
		}
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(fields["secret"], "whsec_"))
	if err != nil {
		t.Fatal(err)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(fields["webhook-id"] + "." + fields["webhook-timestamp"] + "." + fields["body"]))
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	if fields["webhook-signature"] != want {
		t.Errorf("docs/events.md signature example: says %s, the computation gives %s", fields["webhook-signature"], want)
	}
	ev := checkEvent(t, "signing example body", []byte(fields["body"]))
	if ev.ID != fields["webhook-id"] {
		t.Errorf("signing example: webhook-id %s differs from the body's id %s", fields["webhook-id"], ev.ID)
	}
	// The request example shows the same signature.
	if got := signatureHeader(t); got != want {
		t.Errorf("docs/events.md request example shows webhook-signature %q, want %q", got, want)
	}
}

// signatureHeader returns the webhook-signature header shown in the ```http request example.
func signatureHeader(t *testing.T) string {
	t.Helper()
	for _, b := range fencedBlocks(t, eventsDoc, "http") {
		for _, line := range strings.Split(b, "\n") {
			if v, ok := strings.CutPrefix(line, "webhook-signature: "); ok {
				return v
			}
		}
	}
	t.Fatal("no webhook-signature header in an http block")
	return ""
}
