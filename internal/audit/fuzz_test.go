package audit

import (
	"reflect"
	"testing"
	"time"
)

// FuzzDecode: a stored line (a file anyone with access may edit, or a row of the shared table)
// never panics the reader; a line read as a record is stored again (Line) as a line that reads
// back as the same record, so migrate-store's copy keeps what `audit` showed.
func FuzzDecode(f *testing.F) {
	r := Record{Time: time.Date(2026, 12, 1, 9, 0, 0, 5, time.UTC), Tool: "t3_dispatch", Machine: "mac", Thread: "th-1",
		Client: Client{Name: "agent", Version: "1"}, Replica: "host-1-abc", Approval: Accepted, Result: ResultOK}
	r.SetPrompt("finish the job")
	line, err := r.Line()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(line)
	f.Add([]byte(`{"tool":"t3_answer","time":"2025-06-01T08:00:00+02:00","ms":-1}`))
	f.Add([]byte(`{"tool":""}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, line []byte) {
		r, ok := Decode(line)
		if !ok {
			return
		}
		again, err := r.Line()
		if err != nil {
			return // a time JSON cannot hold (year beyond 9999): Write refuses it too
		}
		r2, ok := Decode(again)
		want := r.normalized()
		if r.Time.IsZero() { // stored with the time it was stored at
			want.Time = r2.Time
		}
		if !ok || !reflect.DeepEqual(want, r2) {
			t.Fatalf("%s read as %+v, stored again as %s, read back as %+v (%v)", line, r, again, r2, ok)
		}
	})
}
