package guestctl

import (
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// TestLabJobStartedAtKills: a job's started_at (which vm_agent_exec with
// wait: false answers, "pass it to kill_process with the pid") is the
// process's start as the guest's process list shows it, so a kill checked
// against it reaches the job's process; before, it was the helper's clock
// when the job was recorded, and the kill was refused as a reused pid.
func TestLabJobStartedAtKills(t *testing.T) {
	h, _ := labHelper(t, "cg")
	ctx := testCtx(t, 3*time.Minute)
	s := sandboxSession(t, ctx, h, "cg", wire.Sandbox{})
	st, err := h.Start(ctx, "cg", RunRequest{Session: s.ID, Shell: "exec sleep 1101", TimeoutMS: 60000})
	if err != nil {
		t.Fatalf("Start = %v; want nil", err)
	}
	js, err := h.Status(ctx, "cg", StatusRequest{ID: st.ID})
	if err != nil || js.StartedAt != st.StartedAt {
		t.Fatalf("Status(%s) = started_at %d, %v; want the start's %d", st.ID, js.StartedAt, err, st.StartedAt)
	}
	if _, err := h.Kill(ctx, "cg", st.PID, "KILL", st.StartedAt); err != nil {
		t.Fatalf("Kill(pid %d, started_at %d) = %v; want the job's process killed", st.PID, st.StartedAt, err)
	}
	for js.State == wire.JobRunning {
		if js, err = h.Status(ctx, "cg", StatusRequest{ID: st.ID, Wait: 10 * time.Second}); err != nil {
			t.Fatalf("Status(%s) = %v", st.ID, err)
		}
	}
	if js.Signal != 9 {
		t.Errorf("the job after the kill = %+v; want ended by signal 9", js)
	}
}
