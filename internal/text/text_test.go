package text

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestRunes(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"héllo", 2, "hé"},
		{"héllo", 5, "héllo"},
		{"héllo", 9, "héllo"},
		{"héllo", 0, ""},
		{"", 3, ""},
		{"日本語", 1, "日"},
	} {
		if got := Runes(tc.s, tc.n); got != tc.want {
			t.Errorf("Runes(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
}

func TestBytes(t *testing.T) {
	// "日" is 3 bytes: a cut inside it steps back to the rune's start.
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"a日b", 1, "a"},
		{"a日b", 2, "a"},
		{"a日b", 3, "a"},
		{"a日b", 4, "a日"},
		{"a日b", 5, "a日b"},
		{"a日b", 0, ""},
		{"a日b", -1, ""},
	} {
		if got := prefixBytes(tc.s, tc.n); got != tc.want {
			t.Errorf("Bytes(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
}

func TestCut(t *testing.T) {
	if got := Cut("héllo wörld", 5); got != "héllo…" {
		t.Errorf("Cut = %q", got)
	}
	if got := Cut("héllo", 5); got != "héllo" {
		t.Errorf("Cut of a short string = %q", got)
	}
}

func TestSnippet(t *testing.T) {
	if got := Snippet("  line one\n\tline  two  ", 100); got != "line one line two" {
		t.Errorf("Snippet flattens: %q", got)
	}
	if got := Snippet("ab日本", 4); got != "ab…" {
		t.Errorf("Snippet on a rune boundary: %q", got)
	}
	if got := Snippet("abcdef", 6); got != "abcdef" {
		t.Errorf("Snippet at the limit: %q", got)
	}
}

func TestQuoted(t *testing.T) {
	if got := Quoted(`mac"1`); got != `"mac\"1"` {
		t.Errorf("Quoted short = %s", got)
	}
	long := strings.Repeat("é", 100) // 200 bytes
	got := Quoted(long)
	want := `"` + strings.Repeat("é", 64) + `"… (200 bytes)`
	if got != want {
		t.Errorf("Quoted long = %s\nwant %s", got, want)
	}
}

func TestQuoteList(t *testing.T) {
	if got := QuoteList([]string{"dispatch", "an\"swer"}); got != `"dispatch", "an\"swer"` {
		t.Errorf("QuoteList = %s", got)
	}
	if got := QuoteList(nil); got != "" {
		t.Errorf("QuoteList(nil) = %q", got)
	}
}

// Whatever the input, a cut of valid UTF-8 stays valid UTF-8 and within its bound.
func FuzzCuts(f *testing.F) {
	f.Add("héllo wörld 日本語", 3)
	f.Add("", 0)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if !utf8.ValidString(s) || n < 0 || n > 1<<16 {
			t.Skip()
		}
		if r := Runes(s, n); !utf8.ValidString(r) || utf8.RuneCountInString(r) > n || !strings.HasPrefix(s, r) {
			t.Fatalf("Runes(%q, %d) = %q", s, n, r)
		}
		if b := prefixBytes(s, n); !utf8.ValidString(b) || len(b) > n || !strings.HasPrefix(s, b) {
			t.Fatalf("Bytes(%q, %d) = %q", s, n, b)
		}
		if c := Snippet(s, n); !utf8.ValidString(c) || len(c) > n+len(Ellipsis) {
			t.Fatalf("Snippet(%q, %d) = %q", s, n, c)
		}
	})
}
