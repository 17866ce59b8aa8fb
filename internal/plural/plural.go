// Package plural writes counts in words: "1 thread", "2 threads". Every
// message that counts something goes through it, so none says "1 threads".
package plural

import "strconv"

// Count is "1 thing" or "n things" (regular English plurals only).
func Count(n int, thing string) string {
	if n == 1 || n == -1 {
		return strconv.Itoa(n) + " " + thing
	}
	return strconv.Itoa(n) + " " + thing + "s"
}
