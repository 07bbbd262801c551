package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/digitalocean/go-qemu/qmp/raw"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
)

// requireQEMU applies labtest's skip rule and returns QEMU's path.
func requireQEMU(t testing.TB) string {
	t.Helper()
	labtest.RequireQEMU(t)
	path, err := exec.LookPath(lab.QEMUBinary)
	if err != nil {
		t.Fatalf("LookPath(%q) = %v", lab.QEMUBinary, err)
	}
	return path
}

// startBareQEMU starts a QEMU with no machine and a QMP socket, and returns
// the socket path. The test owns the process: it is killed by pid and waited
// for at cleanup (and dies with the test binary through Pdeathsig).
func startBareQEMU(t testing.TB) (sock string, proc *os.Process) {
	t.Helper()
	bin := requireQEMU(t)
	dir := t.TempDir()
	sock = filepath.Join(dir, "qmp.sock")
	cmd := exec.Command(bin, "-machine", "none", "-nodefaults", "-display", "none",
		"-qmp", "unix:"+sock+",server=on,wait=off")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start qemu: %v", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-waited
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		// The socket file exists from bind(); wait until QEMU also listens.
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return sock, cmd.Process
		}
		select {
		case err := <-waited:
			waited <- err
			t.Fatalf("qemu exited before creating its QMP socket: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("qemu did not create %s", sock)
		}
	}
}

func TestMonitorRealQEMU(t *testing.T) {
	sock, _ := startBareQEMU(t)
	m := NewMonitor("unix", sock, MonitorOptions{})
	if err := m.Connect(); err != nil {
		t.Fatalf("Connect() = %v; want nil", err)
	}
	defer m.Disconnect()
	g, ok := m.Greeting()
	if !ok || g.Version.QEMU.Major == 0 {
		t.Errorf("Greeting() = %+v, %v; want a QEMU version", g, ok)
	}
	r := raw.NewMonitor(m)

	st, err := r.QueryStatus()
	if err != nil {
		t.Fatalf("raw QueryStatus() = %v; want nil", err)
	}
	if st.Status != raw.RunStateRunning || !st.Running {
		t.Errorf("raw QueryStatus() = %+v; want running", st)
	}

	// The schema reply is far above go-qemu's own 64 KiB line limit.
	out, err := m.Run([]byte(`{"execute":"query-qmp-schema"}`))
	if err != nil {
		t.Fatalf("Run(query-qmp-schema) = %v; want nil", err)
	}
	if len(out) <= 64<<10 {
		t.Errorf("query-qmp-schema reply is %d bytes; want > 64 KiB", len(out))
	}
	schema, err := r.QueryQMPSchema()
	if err != nil {
		t.Fatalf("raw QueryQMPSchema() = %v; want nil", err)
	}
	var all struct{ Return []json.RawMessage }
	if err := json.Unmarshal(out, &all); err != nil {
		t.Fatal(err)
	}
	if len(schema) != len(all.Return) || len(schema) < 100 {
		t.Errorf("raw QueryQMPSchema() has %d entries; want %d (> 100)", len(schema), len(all.Return))
	}

	_, err = m.Run([]byte(`{"execute":"no-such-command"}`))
	var qe *QMPError
	if !errors.As(err, &qe) || qe.Class != "CommandNotFound" {
		t.Errorf("Run(no-such-command) = %v; want *QMPError{CommandNotFound}", err)
	}

	// stop: the STOP event arrives, and query-status says paused.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := m.Events(ctx)
	if err != nil {
		t.Fatalf("Events() = %v; want nil", err)
	}
	if err := r.Stop(); err != nil {
		t.Fatalf("raw Stop() = %v; want nil", err)
	}
	select {
	case ev := <-events:
		if ev.Event != "STOP" {
			t.Errorf("event after stop = %q; want STOP", ev.Event)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no STOP event after stop")
	}
	if st, err := r.QueryStatus(); err != nil || st.Status != raw.RunStatePaused {
		t.Errorf("raw QueryStatus() after stop = %+v, %v; want paused", st, err)
	}
}

func TestMonitorRealQEMUQuit(t *testing.T) {
	sock, _ := startBareQEMU(t)
	m := NewMonitor("unix", sock, MonitorOptions{Timeout: 5 * time.Second})
	if err := m.Connect(); err != nil {
		t.Fatalf("Connect() = %v; want nil", err)
	}
	defer m.Disconnect()
	if _, err := m.Run([]byte(`{"execute":"quit"}`)); err != nil {
		t.Fatalf("Run(quit) = %v; want nil", err)
	}
	_, err := m.Run([]byte(`{"execute":"query-status"}`))
	if !errors.Is(err, ErrNotConnected) {
		t.Errorf("Run(query-status) after quit = %v; want ErrNotConnected", err)
	}
}
