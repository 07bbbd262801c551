package guestctl

import (
	"context"
	"fmt"
	"testing"
)

// TestEnsurePrunedAtFleetSize: checking the helper on 1,000 VMs keeps one
// answer per VM until Forget (vm_delete), and no per-VM lock once the
// checks are done; a forgotten VM is checked again on its next use.
func TestEnsurePrunedAtFleetSize(t *testing.T) {
	g := &fileGuest{written: map[string][]byte{}}
	h := New(g.driver(), fixedBinaries{})
	ctx := context.Background()
	for i := range 1000 {
		if err := h.Ensure(ctx, fmt.Sprintf("vm%05d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := h.vmLocks.Len(); n != 0 {
		t.Errorf("per-VM locks after 1,000 checks = %d; want 0", n)
	}
	for i := range 1000 {
		h.Forget(fmt.Sprintf("vm%05d", i))
	}
	h.mu.Lock()
	n := len(h.ensured)
	h.mu.Unlock()
	if n != 0 {
		t.Errorf("cached checks after every VM was forgotten = %d; want 0", n)
	}
	execs := len(g.argvs)
	if err := h.Ensure(ctx, "vm00001"); err != nil || len(g.argvs) == execs {
		t.Errorf("Ensure of a forgotten VM = %v after %d new execs; want it checked again", err, len(g.argvs)-execs)
	}
}
