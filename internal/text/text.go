// Package text shortens and quotes strings for messages: the one place that cuts a string on a
// rune boundary, so that no message, log line, tool result or event ever carries half a character,
// and the one format for a list of allowed values.
package text

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Ellipsis marks where a string was cut.
const Ellipsis = "…"

// Runes returns s's first n characters (runes); all of s when it is that short.
func Runes(s string, n int) string {
	if n <= 0 {
		return ""
	}
	i := 0
	for j := range s {
		if i == n {
			return s[:j]
		}
		i++
	}
	return s
}

// prefixBytes returns the longest prefix of s that is at most n bytes and ends on a rune boundary.
func prefixBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n < 0 {
		n = 0
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Cut returns s's first n characters, with Ellipsis when it was longer.
func Cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return Runes(s, n) + Ellipsis
}

// Snippet flattens s to one line (runs of white space become one space) and shortens it to at most
// n bytes on a rune boundary, with Ellipsis when it was longer: a peer's reply body in an error.
func Snippet(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	return prefixBytes(s, n) + Ellipsis
}

// quotedLimit bounds a quoted caller-supplied name.
const quotedLimit = 128

// Quoted quotes a caller-supplied name for an error message, cut to a readable length: an agent
// that sent a megabyte as a machine name or thread id gets a message that names it, not the
// megabyte back into its context.
func Quoted(s string) string {
	if len(s) <= quotedLimit {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q%s (%d bytes)", prefixBytes(s, quotedLimit), Ellipsis, len(s))
}

// QuoteList quotes each value and joins them with ", ": `"dispatch", "interrupt"`.
func QuoteList(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = fmt.Sprintf("%q", x)
	}
	return strings.Join(q, ", ")
}
