#include "textflag.h"

// BYTES sets vec's 32 bytes to the byte of the 64-bit pattern pat.
#define BYTES(pat, vec) MOVQ pat, BX; MOVQ BX, X4; VPBROADCASTQ X4, vec

// MASK stores to out the 64-bit mask of the bytes of Y0:Y1 equal to vec's.
#define MASK(vec, out) VPCMPEQB vec, Y0, Y2; VPCMPEQB vec, Y1, Y3; VPMOVMSKB Y2, BX; VPMOVMSKB Y3, CX; SHLQ $32, CX; ORQ CX, BX; MOVQ BX, out

// func masks64(p *[64]byte) (quote, bslash, open, close, comma uint64)
TEXT ·masks64(SB), NOSPLIT, $0-48
	MOVQ p+0(FP), AX
	VMOVDQU (AX), Y0
	VMOVDQU 32(AX), Y1
	BYTES($0x2222222222222222, Y5)
	MASK(Y5, quote+8(FP))
	BYTES($0x5c5c5c5c5c5c5c5c, Y5)
	MASK(Y5, bslash+16(FP))
	BYTES($0x2c2c2c2c2c2c2c2c, Y5)
	MASK(Y5, comma+40(FP))
	// '[' | 0x20 is '{', ']' | 0x20 is '}'
	BYTES($0x2020202020202020, Y5)
	VPOR Y5, Y0, Y0
	VPOR Y5, Y1, Y1
	BYTES($0x7b7b7b7b7b7b7b7b, Y5)
	MASK(Y5, open+24(FP))
	BYTES($0x7d7d7d7d7d7d7d7d, Y5)
	MASK(Y5, close+32(FP))
	VZEROUPPER
	RET
