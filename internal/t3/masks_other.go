//go:build !amd64

package t3

// haveMasks64 is false: masks64 has no vector version on this architecture.
var haveMasks64 = false

func masks64(*[64]byte) (quote, bslash, open, close, comma uint64) {
	panic("t3: masks64 without a vector version")
}
