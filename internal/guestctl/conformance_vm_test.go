//go:build linux

package guestctl

import (
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/libvirttest"
	"github.com/vmgate/vmgate/plugins/libvirt"
)

// The roads' conformance: what a Helper gives through each road to
// vmgate-guest (the resident helper over the driver's channel, through the
// agent's exec and its socket, or a process per command), the same on
// each, on QEMU and on libvirt. Jobs need the resident helper: on the
// per-command road they reach it through the agent's exec.

// noChannel is a driver without its optional capabilities, the helper's
// channel among them: its Helper falls back as on a backend without one.
type noChannel struct{ hypervisor.Driver }

// roadSuite runs the helper's commands through h on vm, whose road must be
// want's kind and way.
func roadSuite(t *testing.T, h *Helper, vm string, want Road) {
	ctx := testCtx(t, 10*time.Minute)
	if r := h.CheckRoad(ctx, vm); r.Kind != want.Kind || r.Via != want.Via {
		t.Fatalf("road of %s = %+v; want %s via %q", vm, r, want.Kind, want.Via)
	}
	sb := wire.Sandbox{BestEffort: []wire.Feature{wire.FeatureCgroup}}
	s := sandboxSession(t, ctx, h, vm, sb)
	t.Run("run in a session", func(t *testing.T) {
		res, err := h.Run(ctx, vm, RunRequest{Session: s.ID, Shell: "id -u; echo x > /root/road-escape"})
		if err != nil || strings.TrimSpace(string(res.Stdout)) != strconv.Itoa(s.Enforced.UID) || res.ExitCode == 0 {
			t.Errorf("Run in the session = %+v, %v; want uid %d and the write to /root refused", res, err, s.Enforced.UID)
		}
	})
	t.Run("one-shot sandbox", func(t *testing.T) {
		before, err := h.SessionList(ctx, vm)
		if err != nil {
			t.Fatal(err)
		}
		res, err := h.Run(ctx, vm, RunRequest{Sandbox: &sb, Argv: []string{"id", "-u"}})
		if uid, _ := strconv.Atoi(strings.TrimSpace(string(res.Stdout))); err != nil || res.ExitCode != 0 || uid == 0 {
			t.Errorf("a one-shot sandboxed run = %+v, %v; want exit 0 as a uid of its own", res, err)
		}
		if after, err := h.SessionList(ctx, vm); err != nil || len(after) != len(before) {
			t.Errorf("sessions after the one-shot run: %d (%v); want %d, its own gone", len(after), err, len(before))
		}
	})
	t.Run("guards, processes, metrics, files", func(t *testing.T) {
		if _, err := h.Kill(ctx, vm, 1, "TERM", 0); !errors.Is(err, ErrRefused) {
			t.Errorf("Kill(1) = %v; want refused", err)
		}
		if ps, err := h.PS(ctx, vm, ""); err != nil || len(ps) < 2 {
			t.Errorf("PS = %d processes, %v; want the guest's", len(ps), err)
		}
		if m, err := h.Metrics(ctx, vm, 0); err != nil || m.CPU.Count < 1 {
			t.Errorf("Metrics = %+v, %v; want the guest's CPUs", m.CPU, err)
		}
		if fi, err := h.FileStat(ctx, vm, "/etc/hostname", false, false); err != nil || fi.Type != "file" {
			t.Errorf("FileStat(/etc/hostname) = %+v, %v; want a file", fi, err)
		}
	})
	t.Run("a job, ended with its session", func(t *testing.T) {
		st, err := h.Start(ctx, vm, RunRequest{Session: s.ID, Shell: "echo started; sleep 300", TimeoutMS: 600000})
		if err != nil {
			t.Fatalf("Start() = %v", err)
		}
		js, err := h.Status(ctx, vm, StatusRequest{ID: st.ID, Wait: 20 * time.Second})
		if err != nil || js.State != wire.JobRunning || string(js.Stdout.Data) != "started\n" {
			t.Fatalf("Status = %+v, %v; want running with its first line", js, err)
		}
		if _, err := h.SessionDestroy(ctx, vm, s.ID); err != nil {
			t.Fatal(err)
		}
		js, err = h.Status(ctx, vm, StatusRequest{ID: st.ID})
		if err != nil || js.State == wire.JobRunning || !js.Canceled {
			t.Errorf("Status after the session's destroy = %+v, %v; want ended, canceled", js, err)
		}
	})
	t.Logf("%s: %s", vm, h.Road(vm))
}

func TestLabRoadsConformance(t *testing.T) {
	t.Run("qemu/resident", func(t *testing.T) {
		h, _ := labHelper(t, "cg")
		roadSuite(t, h, "cg", Road{Kind: RoadResident, Via: ViaChannel})
	})
	t.Run("qemu/call", func(t *testing.T) {
		h, _ := labHelper(t, "cg")
		roadSuite(t, New(noChannel{h.d}, h.bins, WithCallRoad(true)), "cg", Road{Kind: RoadResident, Via: ViaCall})
	})
	t.Run("qemu/per-command", func(t *testing.T) {
		h, _ := labHelper(t, "cg")
		roadSuite(t, New(noChannel{h.d}, h.bins), "cg", Road{Kind: RoadPerCommand})
	})
	env := libvirttest.Env(t)
	d, err := libvirt.New(libvirt.Config{URI: env.URI(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	bins := &DirBinaries{Dirs: []string{guestDir}}
	t.Run("libvirt/resident", func(t *testing.T) {
		roadSuite(t, New(d, bins), libvirtVM, Road{Kind: RoadResident, Via: ViaChannel})
	})
	t.Run("libvirt/per-command", func(t *testing.T) {
		roadSuite(t, New(noChannel{d}, bins), libvirtVM, Road{Kind: RoadPerCommand})
	})
}
