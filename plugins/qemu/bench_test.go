package qemu

import (
	"testing"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
	"github.com/digitalocean/go-qemu/qmp/raw"
)

// BenchmarkQueryStatus compares query-status through our Monitor with the
// baseline, go-qemu's own SocketMonitor, against the same bare QEMU. Read
// the result as the ratio of the two ns/op figures.
func BenchmarkQueryStatus(b *testing.B) {
	sock, _ := startBareQEMU(b)
	run := func(b *testing.B, m qmp.Monitor) {
		if err := m.Connect(); err != nil {
			b.Fatalf("Connect() = %v", err)
		}
		defer m.Disconnect()
		r := raw.NewMonitor(m)
		b.ResetTimer()
		for b.Loop() {
			if _, err := r.QueryStatus(); err != nil {
				b.Fatalf("QueryStatus() = %v", err)
			}
		}
	}
	b.Run("baseline=go-qemu", func(b *testing.B) {
		m, err := qmp.NewSocketMonitor("unix", sock, 5*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		run(b, m)
	})
	b.Run("monitor", func(b *testing.B) {
		run(b, NewMonitor("unix", sock, MonitorOptions{}))
	})
}
