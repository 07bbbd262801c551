package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
	"github.com/vmgate/vmgate/plugins/qemu"
)

// binary is the vmgate-guest build TestMain makes for the lab guest.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vmgate-guest-metrics-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	binary = filepath.Join(dir, "vmgate-guest")
	code := func() int {
		defer os.RemoveAll(dir)
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", binary, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building vmgate-guest: %v\n%s", err, out)
			return 2
		}
		return labtest.Main(m, lab.Spec{Name: "gm"})
	}()
	os.Exit(code)
}

// guest runs argv in the lab guest through the QEMU driver.
func guest(t *testing.T, ctx context.Context, d hypervisor.Driver, argv ...string) []byte {
	t.Helper()
	res, err := hypervisor.Run(ctx, d, "gm", hypervisor.ExecRequest{Argv: argv, Timeout: time.Minute})
	if err != nil || res.ExitCode != 0 || res.Signal != 0 {
		t.Fatalf("%q in the guest = %+v (stderr %q), %v", argv, res, res.Stderr, err)
	}
	return res.Stdout
}

func guestMetrics(t *testing.T, ctx context.Context, d hypervisor.Driver) wire.Metrics {
	t.Helper()
	out := guest(t, ctx, d, "/tmp/vmgate-guest", "metrics", "--sample-ms", "1000")
	var reply struct {
		OK     bool         `json:"ok"`
		Result wire.Metrics `json:"result"`
	}
	if err := json.Unmarshal(out, &reply); err != nil || !reply.OK {
		t.Fatalf("vmgate-guest metrics = %s, %v", out, err)
	}
	return reply.Result
}

// TestGuestMetricsMoveUnderLoad: in a lab guest, vmgate-guest metrics sees
// a CPU hog and a 64 MiB memory hog.
func TestGuestMetricsMoveUnderLoad(t *testing.T) {
	v := labtest.VM(t, "gm")
	d, err := qemu.New(qemu.Config{LabDir: filepath.Dir(v.Dir), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx, cancel := testload.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	data, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.FileWrite(ctx, "gm", "/tmp/vmgate-guest", data, 0o755); err != nil {
		t.Fatalf("pushing vmgate-guest: %v", err)
	}
	idle := guestMetrics(t, ctx, d)
	if idle.CPU.Count != 1 || idle.Memory.TotalBytes == 0 || idle.Memory.TotalBytes > uint64(lab.DefaultMemoryMB)<<20 {
		t.Errorf("idle guest metrics: CPU %+v, memory %+v; want 1 CPU and at most %d MiB", idle.CPU, idle.Memory, lab.DefaultMemoryMB)
	}
	var dataDisk *wire.DiskUsage
	for i := range idle.Disks {
		if idle.Disks[i].Mountpoint == "/data" {
			dataDisk = &idle.Disks[i]
		}
	}
	if dataDisk == nil || dataDisk.Device != "/dev/vda" || dataDisk.TotalBytes == 0 {
		t.Errorf("idle guest disks = %+v; want /data on /dev/vda", idle.Disks)
	}

	// A CPU hog, and a 64 MiB buffer held by dd blocked writing to a pipe
	// nobody reads.
	pids := strings.Fields(string(guest(t, ctx, d, "/bin/sh", "-c",
		`(while :; do :; done) >/dev/null 2>&1 & echo $!; (dd if=/dev/zero bs=64M count=1 2>/dev/null | sleep 600) >/dev/null 2>&1 & echo $!`)))
	// The hogs go with the VM, which labtest stops after the tests; the
	// CPU hog is killed now so the guest is quiet for any later test.
	t.Cleanup(func() {
		cctx, ccancel := testload.WithTimeout(context.Background(), time.Minute)
		defer ccancel()
		hypervisor.Run(cctx, d, "gm", hypervisor.ExecRequest{Argv: append([]string{"kill", "-9"}, pids...)})
	})
	var busy wire.Metrics
	deadline := time.Now().Add(testload.Scale(2 * time.Minute))
	for {
		busy = guestMetrics(t, ctx, d)
		if busy.CPU.Percent >= 80 && busy.Memory.UsedBytes >= idle.Memory.UsedBytes+48<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("under load: CPU %.1f%% (idle %.1f%%), memory used %d MiB (idle %d MiB); want the CPU near 100%% and 48 MiB more used",
				busy.CPU.Percent, idle.CPU.Percent, busy.Memory.UsedBytes>>20, idle.Memory.UsedBytes>>20)
		}
	}
	if busy.Load.ProcsRunning < 2 {
		t.Errorf("under load: procs running %d; want the hog and vmgate-guest", busy.Load.ProcsRunning)
	}
	t.Logf("idle: cpu %.1f%%, used %d MiB; loaded: cpu %.1f%%, used %d MiB, load1 %.2f",
		idle.CPU.Percent, idle.Memory.UsedBytes>>20, busy.CPU.Percent, busy.Memory.UsedBytes>>20, busy.Load.Load1)
}
