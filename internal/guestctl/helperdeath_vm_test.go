//go:build linux

package guestctl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/mux"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/plugins/qemu"
)

// logTap keeps the messages and attributes a driver logs.
type logTap struct {
	mu    sync.Mutex
	lines []string
}

func (l *logTap) Enabled(context.Context, slog.Level) bool { return true }
func (l *logTap) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logTap) WithGroup(string) slog.Handler            { return l }
func (l *logTap) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	l.mu.Lock()
	l.lines = append(l.lines, b.String())
	l.mu.Unlock()
	return nil
}

// with returns the lines that contain s.
func (l *logTap) with(s string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

// TestLabHelperDeathHeard: the resident helper killed from outside (by
// pid, through the agent) is heard at once: QEMU's VSERPORT_CHANGE makes
// the QEMU driver drop the channel's connection, so the call in flight
// fails naming that cause and the next call dials again and restarts the
// helper. The silence limit is an hour: a call that waited it out would
// outlast the test's context, and no error or log line names the silence.
func TestLabHelperDeathHeard(t *testing.T) {
	v := labtest.VM(t, "cg")
	tap := &logTap{}
	d, err := qemu.New(qemu.Config{LabDir: filepath.Dir(v.Dir), HelperSilenceLimit: time.Hour, Logger: slog.New(tap)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	h := New(d, &DirBinaries{Dirs: []string{guestDir}})
	ctx := testCtx(t, 5*time.Minute)
	r := h.CheckRoad(ctx, "cg")
	if r.Kind != RoadResident || r.Via != ViaChannel {
		t.Fatalf("road = %s; want resident over the channel", r)
	}
	old := r.Helper.PID

	// A call in flight on the channel when the helper dies.
	inFlight := make(chan error, 1)
	go func() {
		_, err := h.Run(ctx, "cg", RunRequest{Argv: []string{"sh", "-c", "sleep 1096"}, TimeoutMS: 240000})
		inFlight <- err
	}()
	for len(matching(t, ctx, h, "cg", "", "sleep 1096")) == 0 {
		select {
		case err := <-inFlight:
			t.Fatalf("Run(sleep 1096) ended before the kill: %v", err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		default:
		}
	}
	endResident(t, ctx, h, "cg")
	err = <-inFlight
	if !errors.Is(err, hypervisor.ErrHelperLost) || !strings.Contains(err.Error(), "VSERPORT_CHANGE") {
		t.Errorf("the call in flight when the helper died = %v; want ErrHelperLost naming VSERPORT_CHANGE", err)
	}
	if errors.Is(err, mux.ErrSilent) {
		t.Errorf("the call in flight = %v; want it dropped on QEMU's event, not the silence limit", err)
	}

	// The next call reconnects: a new helper answers.
	ps, err := h.PS(ctx, "cg", "")
	if err != nil {
		t.Fatalf("PS after the helper died = %v; want the channel dialled again and the helper restarted", err)
	}
	if r := h.Road("cg"); r.Kind != RoadResident || r.Via != ViaChannel || r.Helper == nil || r.Helper.PID == old {
		t.Errorf("road after the kill = %+v; want resident over the channel, a new helper (not pid %d)", r, old)
	}
	for _, p := range ps {
		if strings.Contains(p.Cmdline, "sleep 1096") {
			sh(t, ctx, h, "cg", fmt.Sprintf("kill -9 %d", p.PID))
		}
	}
	if drops := tap.with("helper channel dropped"); len(drops) == 0 || !strings.Contains(drops[0], "VSERPORT_CHANGE") {
		t.Errorf("driver log: %q; want the channel dropped, naming VSERPORT_CHANGE", drops)
	}
	if silent := tap.with(mux.ErrSilent.Error()); len(silent) != 0 {
		t.Errorf("driver log names the silence limit: %q", silent)
	}
}
