package t3

import "golang.org/x/sys/cpu"

// haveMasks64 says whether masks64 may be called: it needs AVX2.
var haveMasks64 = cpu.X86.HasAVX2

// masks64 is the bit masks of the quotes, backslashes, opening and closing
// brackets of the 64 bytes at p (bit k for p[k]): two 32-byte compares per
// class (masks_amd64.s), where eight bytes at a time of integer arithmetic
// (blockMasks) cost about what the token loop did.
//
//go:noescape
func masks64(p *[64]byte) (quote, bslash, open, close uint64)
