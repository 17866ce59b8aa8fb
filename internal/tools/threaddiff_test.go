package tools

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
)

// The diff T3 gave for run 2 in fixture 22: a modified README.md, a changed
// line of src/one.txt and a new two.txt (T3's checkpoint calls all three
// "modified"; the diff tells them apart).
func TestDiffFilesFromRecordedDiff(t *testing.T) {
	b, err := os.ReadFile("../../testdata/t3/t3-v2-pr2829/22-ws-turn-diffs.json")
	if err != nil {
		t.Fatal(err)
	}
	var fx struct {
		Frames []struct{ Dir, Data string } `json:"frames"`
	}
	if err := json.Unmarshal(b, &fx); err != nil {
		t.Fatal(err)
	}
	diff := ""
	for _, f := range fx.Frames {
		var m struct {
			Tag  string `json:"_tag"`
			Exit struct {
				Value struct {
					From int    `json:"fromTurnCount"`
					Diff string `json:"diff"`
				} `json:"value"`
			} `json:"exit"`
		}
		if f.Dir == "recv" && json.Unmarshal([]byte(f.Data), &m) == nil && m.Tag == "Exit" && m.Exit.Value.Diff != "" {
			diff = m.Exit.Value.Diff
			break
		}
	}
	if diff == "" {
		t.Fatal("no diff in fixture 22")
	}
	got := diffFiles(diff)
	want := []struct {
		path, kind string
		add, del   int
	}{{"README.md", "modified", 1, 0}, {"src/one.txt", "modified", 1, 1}, {"two.txt", "added", 1, 0}}
	if len(got) != len(want) {
		t.Fatalf("files = %+v", got)
	}
	for i, w := range want {
		g := got[i]
		if g.Path != w.path || g.Kind.Value != w.kind || g.Additions.Value != w.add || g.Deletions.Value != w.del {
			t.Errorf("file %d = %+v, want %+v", i, g, w)
		}
	}
	// Cut at a line end within the limit, the marker saying how much of the whole is shown.
	c := cutDiff(diff, 100)
	n := strings.LastIndexByte(diff[:100], '\n') + 1
	if c != diff[:n]+"… [diff cut: "+strconv.Itoa(n)+" of 421 bytes shown]\n" || len(diff) != 421 {
		t.Errorf("cut = %q", c)
	}
	if cutDiff(diff, 421) != diff {
		t.Error("a diff within the limit was cut")
	}
}
