package config

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestMatch(t *testing.T) {
	cases := []struct {
		pattern, name string
		want          bool
	}{
		{"", "", true},
		{"", "a", false},
		{"abc", "abc", true},
		{"abc", "abd", false},
		{"abc", "ab", false},
		{"abc", "abcd", false},
		{"*", "", true},
		{"*", "anything/at/all", true},
		{"**", "x", true},
		{"a*", "a", true},
		{"a*", "abc/def", true},
		{"*c", "abc", true},
		{"*c", "abd", false},
		{"a*b*c", "a__b__c", true},
		{"a*b*c", "a__c__b", false},
		{"a*b", "abbb", true},
		{"*a*a*a*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false}, // no blow-up
		{"/home/*", "/home/me/src/deep/x", true},
		{"/home/*/x", "/home/a/b/c/x", true},
		{"?", "a", true},
		{"?", "", false},
		{"?", "ab", false},
		{"?", "/", true},
		{"?", "é", true}, // one rune, two bytes
		{"??", "é", false},
		{"a?c", "abc", true},
		{"[abc]", "b", true},
		{"[abc]", "d", false},
		{"[a-c]x", "bx", true},
		{"[a-c]x", "dx", false},
		{"[!a-c]x", "dx", true},
		{"[!a-c]x", "bx", false},
		{"[]]", "]", true},
		{"[]a]", "a", true},
		{"[!]]", "]", false},
		{"[!]]", "x", true},
		{"[a-]", "-", true},
		{"[-a]", "-", true},
		{"[a-]", "b", false},
		{"[\\]]", "]", true},
		{"[\\!a]", "!", true},
		{"[é-ë]", "ê", true},
		{"[!/]*", "/x", false},
		{"[a-cx-z]", "y", true},
		{"[!]", "!", false}, // see TestMatchMalformed: "[!]" is unclosed
		{"\\*", "*", true},
		{"\\*", "a", false},
		{"\\?", "?", true},
		{"\\[", "[", true},
		{"\\a", "a", true},
		{"a\\\\b", "a\\b", true},
		{"api-*", "api-gateway", true},
		{"API-*", "api-gateway", false}, // case-sensitive
	}
	for _, tc := range cases {
		got, err := matchPattern(tc.pattern, tc.name)
		if tc.pattern == "[!]" {
			if err == nil {
				t.Errorf("matchPattern(%q): want an error", tc.pattern)
			}
			continue
		}
		if err != nil {
			t.Errorf("matchPattern(%q, %q): %v", tc.pattern, tc.name, err)
			continue
		}
		if got != tc.want {
			t.Errorf("matchPattern(%q, %q) = %v, want %v", tc.pattern, tc.name, got, tc.want)
		}
	}
}

func TestMatchMalformed(t *testing.T) {
	cases := map[string]string{
		"[abc":   "missing ]",
		"[":      "missing ]",
		"[!":     "missing ]",
		"[]":     "missing ]",
		"[!]":    "missing ]",
		"a[b-":   "missing ]",
		"[a\\":   "missing ]",
		"\\":     "trailing backslash escapes nothing",
		"abc\\":  "trailing backslash escapes nothing",
		"[z-a]":  "range 'z'-'a' is reversed",
		"x[9-0]": "range '9'-'0' is reversed",
	}
	for p, want := range cases {
		err := validatePattern(p)
		if err == nil || err.Error() != want {
			t.Errorf("validatePattern(%q) = %v, want %q", p, err, want)
		}
		ok, err := matchPattern(p, p)
		if err == nil || ok {
			t.Errorf("matchPattern(%q) = %v, %v; want false and an error", p, ok, err)
		}
	}
}

// toRegexp is an independent translation of a compiled pattern into Go's regexp syntax, used as
// the reference the fuzzer checks the hand-written matcher against.
func toRegexp(c compiled) string {
	var b strings.Builder
	b.WriteString(`(?s)\A`)
	for _, t := range c {
		switch t.kind {
		case tokLit:
			b.WriteString(regexp.QuoteMeta(string(t.r)))
		case tokAny:
			b.WriteString(`.`)
		case tokStar:
			b.WriteString(`.*`)
		case tokSet:
			b.WriteByte('[')
			if t.negate {
				b.WriteByte('^')
			}
			for _, r := range t.ranges {
				fmt.Fprintf(&b, `\x{%x}-\x{%x}`, r.lo, r.hi)
			}
			b.WriteByte(']')
		}
	}
	b.WriteString(`\z`)
	return b.String()
}

// escape quotes every character of s so that the result matches exactly s.
func escape(s string) string {
	var b strings.Builder
	for _, r := range s {
		b.WriteByte('\\')
		b.WriteRune(r)
	}
	return b.String()
}

func FuzzMatch(f *testing.F) {
	seeds := [][2]string{
		{"*", "anything"},
		{"api-*", "api-gateway"},
		{"/home/*/src", "/home/me/x/src"},
		{"[!_]*-docs", "user-docs"},
		{"[a-z]?[!0-9]", "ab!"},
		{"[]]x", "]x"},
		{"[a-]", "-"},
		{"\\*\\?\\[", "*?["},
		{"[abc", "a"},
		{"[z-a]", "q"},
		{"a\\", "a"},
		{"*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaa"},
		{"é?[à-ü]", "éxê"},
		{"?", "\xff"},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, name string) {
		ok, err := matchPattern(pattern, name)
		c, cerr := compile(pattern)
		if (err == nil) != (cerr == nil) || (validatePattern(pattern) == nil) != (cerr == nil) {
			t.Fatalf("matchPattern, compile and validatePattern disagree on %q", pattern)
		}
		if err != nil {
			if ok {
				t.Fatalf("malformed %q matched", pattern)
			}
			return
		}
		// Every valid pattern: "*" around it still matches, and an escaped literal matches itself.
		if ok {
			if m, _ := matchPattern("*"+pattern+"*", name); !m {
				t.Fatalf("%q matches %q but *%s* does not", pattern, name, pattern)
			}
		}
		if utf8.ValidString(name) {
			if m, err := matchPattern(escape(name), name); err != nil || !m {
				t.Fatalf("escaped %q does not match itself: %v %v", name, m, err)
			}
		}
		// Against the regexp reference (which only accepts valid UTF-8).
		if utf8.ValidString(pattern) && utf8.ValidString(name) {
			re, err := regexp.Compile(toRegexp(c))
			if err != nil {
				t.Fatalf("reference regexp for %q: %v", pattern, err)
			}
			if want := re.MatchString(name); want != ok {
				t.Fatalf("matchPattern(%q, %q) = %v, reference %s says %v", pattern, name, ok, re, want)
			}
		}
	})
}

func FuzzParse(f *testing.F) {
	if ex, err := os.ReadFile(examplePath); err == nil {
		f.Add(ex)
	}
	f.Add([]byte(""))
	f.Add([]byte(machine(`projects = ["[abc"]`)))
	f.Add([]byte(machine(`token = "x"`)))
	f.Add([]byte(machine(`options = { effort = "high", fast = true }`)))
	f.Add([]byte(machine(`model = "a/b/c"` + "\naccess = \"read\"\napprove = [\"answer\"]")))
	f.Add([]byte("[machines.a]\nurl = \"ftp://x\"\n"))
	f.Add([]byte("machines = 1\n"))
	f.Add([]byte("[[machines.a]]\nurl = \"http://h\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data, "f.toml")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.toml: ") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		// Whatever Parse accepts satisfies every documented invariant.
		if !slices.IsSortedFunc(cfg.Machines, func(a, b Machine) int { return strings.Compare(a.Name, b.Name) }) {
			t.Fatal("machines not sorted")
		}
		for _, m := range cfg.Machines {
			if m.URL == "" || m.TokenEnv == "" || checkURL(m.URL) != nil {
				t.Fatalf("machine %q: url %q token_env %q", m.Name, m.URL, m.TokenEnv)
			}
			for _, p := range m.Projects {
				if validatePattern(p) != nil {
					t.Fatalf("machine %q kept malformed pattern %q", m.Name, p)
				}
			}
			if _, _, ok := m.ModelSelection(); ok != (m.Model != "") {
				t.Fatalf("machine %q: model %q", m.Name, m.Model)
			}
			if m.Access != AccessOperate && m.Access != AccessRead {
				t.Fatalf("machine %q: access %q", m.Name, m.Access)
			}
			for _, a := range m.Approve {
				if !slices.Contains(approvable, a) {
					t.Fatalf("machine %q: approve %q", m.Name, a)
				}
			}
			for k, v := range m.Options {
				switch v.(type) {
				case string, bool:
				default:
					t.Fatalf("machine %q: option %q is %T", m.Name, k, v)
				}
			}
		}
	})
}
