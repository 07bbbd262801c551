package libvirt

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
	"github.com/vmgate/vmgate/plugins/qemu"
)

// The benchmarks compare a guest agent round trip through libvirt
// (QEMUDomainAgentCommand on the shared connection) with the QEMU driver's
// path (qga.Client on the agent socket) to the same kind of lab guest, in
// the same process. Read the ratio of the two ns/op figures, not the
// absolute times (TCG guests on a shared machine).

func benchCtx(b *testing.B) context.Context {
	ctx, cancel := testload.WithTimeout(context.Background(), 10*time.Minute)
	b.Cleanup(cancel)
	return ctx
}

func BenchmarkPing(b *testing.B) {
	b.Run("libvirt", func(b *testing.B) {
		_, d := envDriver(b, Config{})
		a := mustLookup(b, d, vmT1).agent(d)
		ctx := benchCtx(b)
		for b.Loop() {
			if err := a.Ping(ctx); err != nil {
				b.Fatalf("Ping() = %v", err)
			}
		}
	})
	b.Run("qemu", func(b *testing.B) {
		v := labtest.VM(b, "q1")
		c := qga.New(v.QGASocket)
		defer c.Close()
		ctx := benchCtx(b)
		for b.Loop() {
			if err := c.Ping(ctx); err != nil {
				b.Fatalf("Ping() = %v", err)
			}
		}
	})
}

func BenchmarkExecTrue(b *testing.B) {
	req := hypervisor.ExecRequest{Argv: []string{"/bin/true"}}
	run := func(b *testing.B, d hypervisor.Driver, vm string) {
		ctx := benchCtx(b)
		for b.Loop() {
			res, err := hypervisor.Run(ctx, d, vm, req)
			if err != nil || res.ExitCode != 0 {
				b.Fatalf("Run(/bin/true) = %+v, %v; want exit 0", res, err)
			}
		}
	}
	b.Run("libvirt", func(b *testing.B) {
		_, d := envDriver(b, Config{})
		run(b, d, vmT1)
	})
	b.Run("qemu", func(b *testing.B) {
		v := labtest.VM(b, "q1")
		d, err := qemu.New(qemu.Config{LabDir: filepath.Dir(v.Dir), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatalf("qemu.New() = %v", err)
		}
		defer d.Close()
		run(b, d, "q1")
	})
}
