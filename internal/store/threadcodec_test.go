package store

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// threadRecords are records as putThread writes them (json.Marshal of a Thread).
func threadRecords(tb testing.TB) [][]byte {
	now := time.Date(2026, 12, 2, 4, 5, 6, 789000000, time.UTC)
	ts := []Thread{
		{ID: "thread-00000001-aaaa-bbbb-cccc-000000000001", Machine: "load-001", ProjectID: "project-1", ProjectTitle: "load",
			Title: "load thread", Watch: true, CreatedAt: now, UpdatedAt: now.Add(time.Second)},
		{ID: "t1", Machine: "m", Origin: "dispatch", LastMessageID: "msg-1", LastRunID: "run-1", CreatedAt: now.In(time.FixedZone("", 3600))},
		{ID: "t<&>", Machine: "m\u2028", Title: "Fix \"the\" test\t\xff", ProjectTitle: "Ünïcode"},
		{},
	}
	var out [][]byte
	for _, t := range ts {
		b, err := json.Marshal(t)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// decodeThread reads every record as json.Unmarshal reads it: the same thread, or an error where
// json.Unmarshal fails.
func FuzzDecodeThread(f *testing.F) {
	for _, r := range threadRecords(f) {
		f.Add(r)
	}
	f.Add([]byte(`{"id":"a","id":null,"watch":null,"createdAt":null}`))
	f.Add([]byte(`{"ID":"a","Watch":true,"machine":"m"}`))
	f.Add([]byte(`{"id":"a","extra":[1,{"x":"\u0000"}]}`))
	f.Add([]byte(`{"id":"a"} {}`))
	f.Add([]byte(`{"id":"a","createdAt":"2026-12-02T04:05:06.7+25:00"}`))
	f.Add([]byte(`{"id":"a\ud800b","watch":1}`))
	f.Add([]byte(`{"id":"a",}`))
	f.Add([]byte(` {"id" : "a" , "watch" : false } `))
	f.Fuzz(func(t *testing.T, data []byte) {
		var got, want Thread
		gotErr := decodeThread(data, &got)
		wantErr := json.Unmarshal(data, &want)
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("%q: decodeThread error %v, json.Unmarshal error %v", data, gotErr, wantErr)
		}
		if gotErr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\ndecodeThread   %#v\njson.Unmarshal %#v", data, got, want)
		}
	})
}

// The records putThread writes are read by decodeThread itself, not handed to json.Unmarshal:
// every field of Thread is set here, and a field added to Thread but not to decodePlainThread
// fails this test (its key is not one decodePlainThread knows).
func TestDecodeThreadReadsEveryFieldItself(t *testing.T) {
	var th Thread
	setEveryField(t, &th, "decodePlainThread")
	b, err := json.Marshal(th)
	if err != nil {
		t.Fatal(err)
	}
	var got Thread
	if err := decodePlainThread(b, &got); err != nil {
		t.Fatalf("%s: not read by decodePlainThread: %v", b, err)
	}
	if !reflect.DeepEqual(got, th) {
		t.Fatalf("a record read back lost fields:\nwrote %+v\nread  %+v\n(%s)", th, got, b)
	}
}

// BenchmarkDecodeThread is one tracked thread's record as the detector reads it for a chunk's
// thread (GetThreads); encodingJSON is what it cost before.
func BenchmarkDecodeThread(b *testing.B) {
	rec := threadRecords(b)[0]
	b.Run("decodeThread", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var t Thread
			if err := decodeThread(rec, &t); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encodingJSON", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var t Thread
			if err := json.Unmarshal(rec, &t); err != nil {
				b.Fatal(err)
			}
		}
	})
}
