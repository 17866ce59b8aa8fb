package store

import (
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkFdatasync: 16 KiB written then fdatasync, as bbolt's commit does with its pages, into
// a hole (a file's ftruncated tail: the filesystem allocates blocks, and the fdatasync commits its
// journal) and over blocks already written (what the headroom gives, headroom.go). One op is one
// write + fdatasync; p50-ms / p99-ms are the fdatasync's.
func BenchmarkFdatasync(b *testing.B) {
	for _, c := range []struct {
		name string
		at   func(i int) int64
	}{
		{"into-hole", func(i int) int64 { return int64(i) * 16 << 10 }},
		{"written", func(i int) int64 { return int64(i%64) * 16 << 10 }},
	} {
		b.Run(c.name, func(b *testing.B) {
			f, err := os.Create(filepath.Join(b.TempDir(), "f"))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			if err := f.Truncate(int64(b.N+64) * 16 << 10); err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, 16<<10)
			for i := range 64 { // the "written" case's blocks
				if _, err := f.WriteAt(buf, int64(b.N+i)*16<<10); err != nil {
					b.Fatal(err)
				}
			}
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
			at := c.at
			if c.name == "written" {
				at = func(i int) int64 { return int64(b.N+i%64) * 16 << 10 }
			}
			d := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				if _, err := f.WriteAt(buf, at(i)); err != nil {
					b.Fatal(err)
				}
				t := time.Now()
				if err := unix.Fdatasync(int(f.Fd())); err != nil {
					b.Fatal(err)
				}
				d = append(d, time.Since(t))
			}
			b.StopTimer()
			sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
			b.ReportMetric(float64(d[len(d)/2])/1e6, "p50-ms")
			b.ReportMetric(float64(d[min(len(d)-1, len(d)*99/100)])/1e6, "p99-ms")
		})
	}
}
