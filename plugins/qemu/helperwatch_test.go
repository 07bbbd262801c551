package qemu

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-qemu/qmp"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/plugins/internal/helperchan/chantest"
)

// fakeEvents is an events monitor whose VM has two virtserialports with
// ids, the helper's (vmgate-helper) and another (other); the test sends
// the events.
type fakeEvents struct {
	fakeMonitor
	ch chan qmp.Event
}

// Events forwards what the test sends until ctx ends (the driver's Close).
func (f *fakeEvents) Events(ctx context.Context) (<-chan qmp.Event, error) {
	out := make(chan qmp.Event)
	go func() {
		defer close(out)
		for {
			select {
			case e := <-f.ch:
				select {
				case out <- e:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

func newFakeEvents() *fakeEvents {
	f := &fakeEvents{ch: make(chan qmp.Event, 8)}
	f.run = func(_ context.Context, cmd string) (string, error) {
		switch {
		case strings.Contains(cmd, "qom-list"):
			return `{"return":[{"name":"vmgate-helper","type":"child<virtserialport>"},{"name":"other","type":"child<virtserialport>"},{"name":"disk0","type":"child<virtio-blk-pci>"}]}`, nil
		case strings.Contains(cmd, `"/machine/peripheral/vmgate-helper"`):
			return `{"return":"org.vmgate.guest.0"}`, nil
		case strings.Contains(cmd, `"/machine/peripheral/other"`):
			return `{"return":"org.qemu.guest_agent.0"}`, nil
		}
		return `{"error":{"class":"GenericError","desc":"unexpected"}}`, nil
	}
	return f
}

// lines is a slog handler keeping each record's message and attributes.
type lines struct {
	mu  sync.Mutex
	all []string
}

func (l *lines) Enabled(context.Context, slog.Level) bool { return true }
func (l *lines) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *lines) WithGroup(string) slog.Handler            { return l }
func (l *lines) Handle(_ context.Context, r slog.Record) error {
	s := r.Message
	r.Attrs(func(a slog.Attr) bool { s += " " + a.Key + "=" + a.Value.String(); return true })
	l.mu.Lock()
	l.all = append(l.all, s)
	l.mu.Unlock()
	return nil
}

func (l *lines) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.all {
		if strings.Contains(s, sub) {
			n++
		}
	}
	return n
}

// TestHelperPortClosedDropsTheChannel: the first helper call starts the
// watch of the VM's events monitor; VSERPORT_CHANGE of another port, or
// of the helper's port opening, changes nothing; the helper's port closing
// fails the call in flight at once (the silence limit is an hour) with
// ErrHelperLost naming the event, logged once.
func TestHelperPortClosedDropsTheChannel(t *testing.T) {
	helper, hung := chantest.MortalHelper(t)
	log := &lines{}
	d := newFakeDriver(t, Config{HelperSilenceLimit: time.Hour, Logger: slog.New(log)}, nil, nil)
	d.configured["vm1"] = VMConfig{Name: "vm1", QMPSocket: "vm1.qmp", QGASocket: "vm1.qga", HelperSocket: helper, EventsSocket: "vm1.events"}
	ev := newFakeEvents()
	d.newEventsMonitor = func(p string) eventsMonitor {
		if p != "vm1.events" {
			t.Errorf("events monitor at %s; want vm1.events", p)
		}
		return ev
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if rep, err := d.HelperCall(ctx, "vm1", hypervisor.HelperCall{Args: []string{"ps"}}); err != nil || string(rep.Stdout) != "ps|" {
		t.Fatalf("HelperCall(ps) = %q, %v", rep.Stdout, err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := d.HelperCall(ctx, "vm1", hypervisor.HelperCall{Args: []string{"die"}})
		done <- err
	}()
	for !hung.Load() {
		select {
		case err := <-done:
			t.Fatalf("HelperCall(die) ended at once: %v", err)
		default:
		}
	}
	for _, e := range []map[string]any{{"id": "other", "open": false}, {"id": "vmgate-helper", "open": true}, {"id": "vmgate-helper", "open": false}} {
		ev.ch <- qmp.Event{Event: "VSERPORT_CHANGE", Data: e}
	}
	err := <-done
	if !errors.Is(err, hypervisor.ErrHelperLost) || !errors.Is(err, errPortClosed) || !strings.Contains(err.Error(), "device vmgate-helper") {
		t.Errorf("HelperCall in flight when the port closed = %v; want ErrHelperLost naming VSERPORT_CHANGE of device vmgate-helper", err)
	}
	if n := log.count("helper channel dropped"); n != 1 {
		t.Errorf("%d drops logged; want 1 (the helper's port closing only): %q", n, log.all)
	}
}

// TestLabVMHelperSockets: a lab VM's helper socket is in its directory;
// its events socket too when the lab made one, none for a VM an older
// vmgate started (nothing to watch, no failed watch every minute).
func TestLabVMHelperSockets(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"new", "old"} {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "vm.json"), []byte(`{}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "new", lab.EventsSocketName), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	d := newFakeDriver(t, Config{LabDir: dir}, nil, nil)
	for _, tc := range []struct{ name, events string }{
		{"new", filepath.Join(dir, "new", lab.EventsSocketName)},
		{"old", ""},
	} {
		vm, err := d.lookup("test", tc.name)
		if err != nil {
			t.Fatalf("lookup(%s) = %v", tc.name, err)
		}
		if want := filepath.Join(dir, tc.name, lab.HelperSocketName); vm.helperPath != want || vm.eventsPath != tc.events {
			t.Errorf("lookup(%s): helper %q, events %q; want %q, %q", tc.name, vm.helperPath, vm.eventsPath, want, tc.events)
		}
	}
}
