package t3

import "golang.org/x/sys/cpu"

// haveMasks64 says whether masks64 may be called: it needs AVX2.
var haveMasks64 = cpu.X86.HasAVX2

// masks64 is masks by two 32-byte compares per class (masks_amd64.s).
//
//go:noescape
func masks64(p *[64]byte) (quote, bslash, open, close, comma uint64)
