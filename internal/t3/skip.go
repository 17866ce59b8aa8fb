package t3

import (
	"encoding/binary"
	"math/bits"
)

// skipContainer moves past the object or array at s.i: to the bracket that
// brings the depth of brackets outside strings back to zero (it does not check
// that brackets pair up, nor anything else: the kept output's json.Valid
// does). Most of a long thread's bounded body is values nothing here reads
// (attempts, nodes, …: 65 % of it), and a value's bytes are mostly short
// strings (keys, ids, timestamps), for each of which a loop over tokens paid
// a few branches (≈ 1.2 GB/s). So the bytes are taken 64 at a time, as bit
// masks of their quotes, backslashes and brackets (vector compares, masks64:
// ≈ 8 GB/s, about the speed of memory; BenchmarkSkipContainer), the strings'
// extent is the masks' running parity, and only the brackets outside strings
// are counted: no branch per string or per token. It ends where the token
// loop it replaced ended (skipContainerTokens in the tests), on any input
// (FuzzSkipContainer).
func (s *scanner) skipContainer() error { return s.skipBlocks(blockState{}) }

// skipRest moves past the rest of the object fields is in: s.i is outside
// any string, at the depth of the object's own keys.
func (s *scanner) skipRest() error { return s.skipBlocks(blockState{depth: 1}) }

// skipBlocks moves s.i to just past the bracket that brings st's depth to zero.
func (s *scanner) skipBlocks(st blockState) error {
	for {
		b, i := s.b, s.i
		for ; i+64 <= len(b); i += 64 {
			if end, ok := st.block((*[64]byte)(b[i : i+64])); ok {
				s.i = i + end + 1
				return nil
			}
		}
		s.i = i // the window may drop what the scan passed (skipFree)
		if !s.more() {
			break
		}
	}
	// The body's last bytes, fewer than 64: padded with spaces, which change
	// no state (inside a string they leave it open).
	var pad [64]byte
	n := copy(pad[:], s.b[s.i:])
	for j := n; j < len(pad); j++ {
		pad[j] = ' '
	}
	if end, ok := st.block(&pad); ok && end < n {
		s.i += end + 1
		return nil
	}
	return errShape
}

// blockState is skipContainer's state between blocks of 64 bytes.
type blockState struct {
	depth int
	// inString is all ones when the previous block ended inside a string.
	inString uint64
	// escaped: the previous block ended inside a string with a backslash
	// that escapes this block's first byte.
	escaped bool
}

// block advances st over the 64 bytes at p; ok when the container ends in
// them, at p[end]. Most blocks of T3's control plane hold no bracket (72 % at
// 5,000 turn items) and no backslash: for those only the parity of their
// quotes matters (whether a string is open at the block's end).
func (st *blockState) block(p *[64]byte) (end int, ok bool) {
	quote, bslash, open, close, _ := masks(p)
	if bslash|open|close == 0 && !st.escaped {
		if bits.OnesCount64(quote)&1 != 0 {
			st.inString = ^st.inString
		}
		return 0, false
	}
	return st.masked(p, quote, bslash, open, close)
}

// masks is the bit masks of the quotes, backslashes, opening and closing
// brackets and commas of the 64 bytes at p (bit k for p[k]): by vector
// compares where the machine has them (masks64), else eight bytes at a time
// by integer arithmetic (SWAR), which is about the token loop's speed.
func masks(p *[64]byte) (quote, bslash, open, close, comma uint64) {
	if haveMasks64 {
		return masks64(p)
	}
	for w := range 8 {
		x := binary.LittleEndian.Uint64(p[w*8:])
		y := x | 0x2020202020202020 // '[' → '{', ']' → '}': they differ only in bit 0x20
		sh := uint(w*8) & 63
		quote |= byteMask(x, '"') << sh
		bslash |= byteMask(x, '\\') << sh
		open |= byteMask(y, '{') << sh
		close |= byteMask(y, '}') << sh
		comma |= byteMask(x, ',') << sh
	}
	return
}

// masked is block given the block's masks.
func (st *blockState) masked(p *[64]byte, quote, bslash, open, close uint64) (end int, ok bool) {
	inString, escapedNext := st.inString, false
	if bslash != 0 || st.escaped {
		// The quotes a backslash escapes are not quotes. Taken in order:
		// a backslash escaped by the one before escapes nothing.
		var esc uint64
		if st.escaped {
			esc = 1
		}
		for m := bslash &^ esc; m != 0; {
			j := bits.TrailingZeros64(m)
			if j == 63 {
				escapedNext = true
				break
			}
			esc |= 2 << j
			m &^= 4<<j - 1 // bits 0 to j+1
		}
		quote &^= esc
	}
	str := prefixXor(quote) ^ inString // inside a string, its opening quote included
	if bslash&^str != 0 {
		// A backslash outside a string (not JSON): it escapes nothing there,
		// which the masks above assumed it did. Byte by byte.
		return st.blockBytes(p)
	}
	st.inString, st.escaped = uint64(int64(str)>>63), escapedNext
	open &^= str
	close &^= str
	if bits.OnesCount64(close) < st.depth { // the container cannot end in this block
		st.depth += bits.OnesCount64(open) - bits.OnesCount64(close)
		return 0, false
	}
	for m := open | close; m != 0; m &= m - 1 {
		if open&(m&-m) != 0 {
			st.depth++
			continue
		}
		if st.depth--; st.depth == 0 {
			return bits.TrailingZeros64(m), true
		}
	}
	return 0, false
}

// blockBytes is block byte by byte, as the token loop read them: a backslash
// escapes the next byte only inside a string.
func (st *blockState) blockBytes(p *[64]byte) (end int, ok bool) {
	for j, c := range p {
		switch {
		case st.escaped:
			st.escaped = false
		case st.inString != 0:
			switch c {
			case '\\':
				st.escaped = true
			case '"':
				st.inString = 0
			}
		default:
			switch c {
			case '"':
				st.inString = ^uint64(0)
			case '{', '[':
				st.depth++
			case '}', ']':
				if st.depth--; st.depth == 0 {
					return j, true
				}
			}
		}
	}
	return 0, false
}

// byteMask is a bit per byte of x (bit k for byte k, little-endian) set where
// that byte is c. The zero-byte test is the exact one (no borrow runs from a
// zero byte into the next), and the eight flags are gathered into the top
// byte by one multiplication whose partial products never overlap.
func byteMask(x uint64, c byte) uint64 {
	return (zeroBytes(x^0x0101010101010101*uint64(c)) >> 7) * 0x0102040810204080 >> 56
}

// zeroBytes is 0x80 in each byte of v that is zero, 0 in the others.
func zeroBytes(v uint64) uint64 {
	const low7 = 0x7f7f7f7f7f7f7f7f
	return ^((v&low7 + low7) | v | low7)
}

// prefixXor sets bit k to the parity of the bits 0 to k of x.
func prefixXor(x uint64) uint64 {
	x ^= x << 1
	x ^= x << 2
	x ^= x << 4
	x ^= x << 8
	x ^= x << 16
	x ^= x << 32
	return x
}
