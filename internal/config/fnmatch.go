package config

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// Allowlist patterns use shell fnmatch syntax, with one deliberate difference from path.Match and
// filepath.Match: `*` also matches '/'. Project allowlists are written against titles ("api-*")
// and workspace roots ("/home/me/src/*"), and an operator who writes "/home/me/src/*" means every
// project below that directory, however deep. Matching is case-sensitive, like fnmatchcase.
//
//	*        any run of characters, including '/' and the empty run
//	?        exactly one character (one UTF-8 rune)
//	[seq]    one character in seq; ranges like a-z; a ']' first in seq is literal
//	[!seq]   one character not in seq
//	\c       the character c, literally (also inside [ ])
//
// A malformed pattern is an error rather than a literal, so a typo in an allowlist is caught when
// the config loads instead of silently matching nothing.

type tokKind uint8

const (
	tokLit  tokKind = iota // one literal rune
	tokAny                 // ?
	tokStar                // * (consecutive stars are collapsed when compiling)
	tokSet                 // [seq] or [!seq]
)

type runeRange struct{ lo, hi rune }

type token struct {
	kind   tokKind
	r      rune        // tokLit
	negate bool        // tokSet
	ranges []runeRange // tokSet; a single character is the range c-c
}

// compiled is a pattern checked and split into tokens once, so matching never re-parses.
type compiled []token

// validatePattern reports whether pattern is a well-formed fnmatch pattern.
func validatePattern(pattern string) error {
	_, err := compile(pattern)
	return err
}

// matchPattern reports whether name matches the fnmatch pattern. The error is non-nil only for a
// malformed pattern, and then the match result is false.
func matchPattern(pattern, name string) (bool, error) {
	c, err := compile(pattern)
	if err != nil {
		return false, err
	}
	return c.match(name), nil
}

func compile(p string) (compiled, error) {
	var out compiled
	for i := 0; i < len(p); {
		r, w := utf8.DecodeRuneInString(p[i:])
		switch r {
		case '*':
			i += w
			if len(out) > 0 && out[len(out)-1].kind == tokStar {
				continue
			}
			out = append(out, token{kind: tokStar})
		case '?':
			i += w
			out = append(out, token{kind: tokAny})
		case '\\':
			i += w
			if i >= len(p) {
				return nil, errors.New("trailing backslash escapes nothing")
			}
			r, w = utf8.DecodeRuneInString(p[i:])
			i += w
			out = append(out, token{kind: tokLit, r: r})
		case '[':
			t, n, err := compileSet(p[i:])
			if err != nil {
				return nil, err
			}
			i += n
			out = append(out, t)
		default:
			i += w
			out = append(out, token{kind: tokLit, r: r})
		}
	}
	return out, nil
}

// compileSet parses a bracket expression at the start of s (s[0] == '[') and returns the token and
// the number of bytes consumed.
func compileSet(s string) (token, int, error) {
	t := token{kind: tokSet}
	i := 1
	if i < len(s) && s[i] == '!' {
		t.negate = true
		i++
	}
	first := true
	for {
		if i >= len(s) {
			return token{}, 0, errors.New("missing ]")
		}
		if s[i] == ']' && !first {
			return t, i + 1, nil
		}
		first = false
		lo, n, err := setChar(s[i:])
		if err != nil {
			return token{}, 0, err
		}
		i += n
		hi := lo
		// A '-' makes a range unless it is the last character before the closing ']'.
		if i+1 < len(s) && s[i] == '-' && s[i+1] != ']' {
			hi, n, err = setChar(s[i+1:])
			if err != nil {
				return token{}, 0, err
			}
			i += 1 + n
			if hi < lo {
				return token{}, 0, fmt.Errorf("range %q-%q is reversed", lo, hi)
			}
		}
		t.ranges = append(t.ranges, runeRange{lo, hi})
	}
}

// setChar reads one (possibly backslash-escaped) character inside a bracket expression.
func setChar(s string) (rune, int, error) {
	if s[0] == '\\' {
		if len(s) < 2 {
			return 0, 0, errors.New("missing ]")
		}
		r, w := utf8.DecodeRuneInString(s[1:])
		return r, 1 + w, nil
	}
	r, w := utf8.DecodeRuneInString(s)
	return r, w, nil
}

func (t *token) matches(r rune) bool {
	switch t.kind {
	case tokLit:
		return t.r == r
	case tokAny:
		return true
	case tokSet:
		in := false
		for _, rg := range t.ranges {
			if rg.lo <= r && r <= rg.hi {
				in = true
				break
			}
		}
		return in != t.negate
	}
	return false
}

// match is the classic single-backtrack wildcard algorithm: on a mismatch, resume after the most
// recent star with that star consuming one more character. Because stars are collapsed and every
// other token consumes exactly one rune, this is correct and runs in O(len(pattern)·len(name)),
// so a hostile pattern cannot blow up (no exponential backtracking).
func (c compiled) match(name string) bool {
	pi, ni := 0, 0
	starPi, starNi := -1, 0
	for ni < len(name) || pi < len(c) {
		if pi < len(c) {
			t := &c[pi]
			if t.kind == tokStar {
				starPi, starNi = pi, ni
				pi++
				continue
			}
			if ni < len(name) {
				r, w := utf8.DecodeRuneInString(name[ni:])
				if t.matches(r) {
					pi++
					ni += w
					continue
				}
			}
		}
		if starPi < 0 || starNi >= len(name) {
			return false
		}
		_, w := utf8.DecodeRuneInString(name[starNi:])
		starNi += w
		pi, ni = starPi+1, starNi
	}
	return true
}
