package plural

import "testing"

func TestCount(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want string
	}{{0, "0 threads"}, {1, "1 thread"}, {2, "2 threads"}} {
		if got := Count(tc.n, "thread"); got != tc.want {
			t.Errorf("Count(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
	if got := Is(1, "wait"); got != "1 wait is" {
		t.Errorf("Is(1) = %q", got)
	}
	if got := Is(3, "wait"); got != "3 waits are" {
		t.Errorf("Is(3) = %q", got)
	}
}
