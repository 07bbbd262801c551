package server

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/server/mcptest"
)

// TestListVMsHostileCorpus runs the corpus's list_vms page cases
// (testdata/hostile/*-list-vms-*.json, which make chaos runs on a lab VM)
// through the gate over a fake backend: each is refused as the case
// expects, in the validate step (the driver is never called), saying what
// was wrong.
func TestListVMsHostileCorpus(t *testing.T) {
	files, err := filepath.Glob("../testdata/hostile/*-list-vms-*.json")
	if err != nil || len(files) < 10 {
		t.Fatalf("list_vms cases in the corpus: %d, %v; want at least 10", len(files), err)
	}
	f := newFixture(t, fixtureOpts{})
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var c struct {
			Body   string   `json:"body"`
			Expect string   `json:"expect"`
			Says   []string `json:"says"`
		}
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		before := f.calls.Load()
		r := f.send(t, c.Body)
		if !mcptest.HasTag(r, c.Expect) {
			t.Errorf("%s: list_vms = %q; want %s", filepath.Base(file), r.Text(), c.Expect)
		}
		for _, s := range c.Says {
			if !strings.Contains(r.Text(), s) {
				t.Errorf("%s: list_vms = %q; want it to say %q", filepath.Base(file), r.Text(), s)
			}
		}
		if n := f.calls.Load() - before; n != 0 {
			t.Errorf("%s: %d driver calls; want none", filepath.Base(file), n)
		}
	}
}

// TestListVMsPageThroughTheGate: list_vms pages through the gate, and its
// structured result (total, next_cursor) matches the output schema the
// catalogue publishes (TestCatalogueOutputSchemas checks that schema).
func TestListVMsPageThroughTheGate(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	r := f.call(t, "list_vms", `{"limit":1}`)
	sc := r.Result.StructuredContent
	vms, _ := sc["vms"].([]any)
	total, _ := sc["total"].(float64)
	if r.Result.IsError || len(vms) != 1 || int(total) < 1 {
		t.Fatalf("list_vms(limit 1) = %q, %v; want one VM and the total", r.Text(), sc)
	}
	if next, _ := sc["next_cursor"].(string); total > 1 && next == "" {
		t.Errorf("list_vms(limit 1) of %v VMs gave no next_cursor", total)
	}
	if want := "1 of "; !strings.HasPrefix(r.Text(), want) {
		t.Errorf("list_vms text %q; want it to start with %q", r.Text(), want)
	}
}
