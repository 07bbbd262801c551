package libvirt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/libvirttest"
	"github.com/vmgate/vmgate/internal/pluginhost"
	"github.com/vmgate/vmgate/internal/testload"
)

// The domains the tests boot in a private libvirtd (libvirttest), named
// for this run (libvirttest.Name): vmT1 is persistent and carries the test
// metadata; vmNoExec is transient with guest-exec blocked in its agent;
// vmOther is transient, carries the metadata but not the vmgate- prefix,
// and is the one whose agent the isolation test hangs.
var (
	vmT1     = libvirttest.Name("vmgate-t1")
	vmNoExec = libvirttest.Name("vmgate-noexec")
	vmOther  = libvirttest.Name("other-t2")
)

const testNS = "https://vmgate.example/libvirt-test"

// TestMain: the test binary is also the plugin: `<test binary> plugin
// libvirt` serves the registered driver over go-plugin, as `vmgate plugin libvirt`
// would, and boots nothing.
func TestMain(m *testing.M) {
	if len(os.Args) >= 3 && os.Args[1] == "plugin" {
		if err := pluginhost.ServeBuiltin(pluginhost.Registered(), os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	libvirttest.Register(
		libvirttest.Spec{Name: vmT1, Persistent: true, Metadata: "lab", MetadataURI: testNS, Disk: true, NIC: true},
		libvirttest.Spec{Name: vmNoExec, Cmdline: map[string]string{"QGA_BLOCK": "guest-exec"}},
		libvirttest.Spec{Name: vmOther, Metadata: "other", MetadataURI: testNS},
	)
	// The lab VM is the QEMU driver's side of the benchmarks; it boots only
	// when a benchmark asks for it.
	code := labtest.Main(m, lab.Spec{Name: "q1"})
	d := libvirttest.Current()
	var pids []int
	if d != nil {
		vl, lv := d.Pids()
		pids = append(pids, vl, lv)
		for _, dom := range d.Domains() {
			if dom.QEMUPID > 0 {
				pids = append(pids, dom.QEMUPID)
			}
		}
	}
	if err := libvirttest.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "libvirttest.Stop:", err)
		code = max(code, 1)
	}
	// Afterwards the daemons and the domains' QEMU processes are gone.
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			fmt.Fprintf(os.Stderr, "after libvirttest.Stop: pid %d still exists (kill 0: %v)\n", pid, err)
			code = max(code, 1)
		}
	}
	os.Exit(code)
}

// envDriver returns the shared libvirtd (booting the domains on first use)
// and a new Driver on it with cfg's filters.
func envDriver(t testing.TB, cfg Config) (*libvirttest.Daemons, *Driver) {
	t.Helper()
	env := libvirttest.Env(t)
	cfg.URI = env.URI()
	cfg.Logger = slog.New(slog.DiscardHandler)
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v) = %v", cfg, err)
	}
	t.Cleanup(func() { d.Close() })
	return env, d
}

func TestConformance(t *testing.T) {
	_, d := envDriver(t, Config{})
	hypervisortest.Run(t, hypervisortest.Harness{Driver: d, VM: vmT1, NoExecVM: vmNoExec,
		Capabilities: libvirtCapabilities, DiskDir: "/data"})
}

func TestFilters(t *testing.T) {
	all := []string{vmOther, vmNoExec, vmT1}
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"none", Config{}, all},
		{"glob", Config{NameGlob: "vmgate-*"}, []string{vmNoExec, vmT1}},
		{"metadata", Config{MetadataURI: testNS}, []string{vmOther, vmT1}},
		{"glob and metadata", Config{NameGlob: "vmgate-*", MetadataURI: testNS}, []string{vmT1}},
		{"glob matching nothing", Config{NameGlob: "nothing-*"}, nil},
		{"other namespace", Config{MetadataURI: "urn:vmgate:other"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, d := envDriver(t, tc.cfg)
			ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			vms, err := d.ListVMs(ctx)
			if err != nil {
				t.Fatalf("ListVMs() error: %v", err)
			}
			var names []string
			for _, vm := range vms {
				// Only these three: other tests' templates and clones come and go.
				if slices.Contains(all, vm.Name) {
					names = append(names, vm.Name)
				}
				if vm.Name == vmT1 && (!vm.Agent || vm.State != hypervisor.StateRunning) {
					t.Errorf("ListVMs() %s = %+v; want running with an agent channel", vmT1, vm)
				}
			}
			if !slices.Equal(names, tc.want) {
				t.Errorf("ListVMs() with %+v = %q; want %q", tc.cfg, names, tc.want)
			}
			for _, name := range all {
				_, err := d.Status(ctx, name)
				if want := slices.Contains(tc.want, name); (err == nil) != want || (!want && !errors.Is(err, hypervisor.ErrUnknownVM)) {
					t.Errorf("Status(%q) with %+v error %v; want visible %v (else %v)", name, tc.cfg, err, want, hypervisor.ErrUnknownVM)
				}
			}
		})
	}
}

// libvirtConn opens the test's own connection to the private libvirtd.
func libvirtConn(t *testing.T, env *libvirttest.Daemons) *golibvirt.Libvirt {
	t.Helper()
	ep, err := parseURI(env.URI())
	if err != nil {
		t.Fatal(err)
	}
	c, err := dialLibvirt(ep, 10*time.Second)
	if err != nil {
		t.Fatalf("connect to %s: %v", env.URI(), err)
	}
	t.Cleanup(func() { c.Disconnect() })
	return c.(*golibvirt.Libvirt)
}

// otherAnswers runs /bin/echo on vmT1.
func otherAnswers(d *Driver, deadline time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	res, err := d.Run(ctx, vmT1, hypervisor.ExecRequest{Argv: []string{"/bin/echo", "alive"}})
	if err == nil && string(res.Stdout) != "alive\n" {
		err = fmt.Errorf("stdout %q; want %q", res.Stdout, "alive\n")
	}
	return err
}

// waitConsole waits until the guest console log at path holds marker.
func waitConsole(ctx context.Context, t *testing.T, path, marker string) {
	t.Helper()
	var b hypervisor.Backoff
	for {
		log, err := os.ReadFile(path)
		if err == nil && strings.Contains(string(log), marker) {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("the guest console %s never said %q (%v)", path, marker, err)
		}
		time.Sleep(b.Next())
	}
}

// waitSlot waits until a domain's agent slot is held (an agent call is in
// libvirt) or free.
func waitSlot(ctx context.Context, t *testing.T, slot chan struct{}, held bool) {
	t.Helper()
	var b hypervisor.Backoff
	for (len(slot) == 1) != held {
		if ctx.Err() != nil {
			t.Fatalf("agent slot held = %v; want %v", len(slot) == 1, held)
		}
		time.Sleep(b.Next())
	}
}

// TestAgentIsolation: a suspended domain's agent calls fail at once (libvirt
// refuses them), and an agent that never answers (qemu-ga stopped in the
// guest) times out within the caller's deadline while another domain
// answers meanwhile. It leaves vmOther's agent stopped: run it last among
// the tests that use vmOther.
func TestAgentIsolation(t *testing.T) {
	env, d := envDriver(t, Config{})
	c := libvirtConn(t, env)
	dom, err := c.DomainLookupByName(vmOther)
	if err != nil {
		t.Fatalf("DomainLookupByName(%s) = %v", vmOther, err)
	}

	t.Run("Suspended", func(t *testing.T) {
		if err := c.DomainSuspend(dom); err != nil {
			t.Fatalf("DomainSuspend(%s) = %v", vmOther, err)
		}
		defer func() {
			if err := c.DomainResume(dom); err != nil {
				t.Errorf("DomainResume(%s) = %v", vmOther, err)
			}
		}()
		ctx, cancel := testload.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		st, err := d.Status(ctx, vmOther)
		if err != nil || st.State != hypervisor.StatePaused || st.AgentConnected {
			t.Errorf("Status(%s) while suspended = %+v, %v; want paused, agent not connected", vmOther, st, err)
		}
		_, err = d.AgentInfo(ctx, vmOther)
		if !errors.Is(err, hypervisor.ErrAgentUnavailable) || !errors.Is(err, hypervisor.ErrVMNotRunning) {
			t.Errorf("AgentInfo(%s) while suspended error %v; want %v and %v", vmOther, err, hypervisor.ErrAgentUnavailable, hypervisor.ErrVMNotRunning)
		}
		if err := otherAnswers(d, time.Minute); err != nil {
			t.Errorf("Run(%s) while %s is suspended: %v", vmT1, vmOther, err)
		}
	})

	t.Run("AgentNeverAnswers", func(t *testing.T) {
		ctx, cancel := testload.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		// How long a command on vmT1 takes now: the hung calls' deadline is
		// a multiple of it, so that on a loaded machine vmT1 still answers
		// well within it.
		start := time.Now()
		if err := otherAnswers(d, time.Minute); err != nil {
			t.Fatalf("Run(%s) before the hang: %v", vmT1, err)
		}
		hungDeadline := max(6*time.Second, 4*time.Since(start))

		// The shell's parent is qemu-ga: stop it once guest-exec has
		// answered, then say so on the console (no agent call may probe it:
		// libvirt would mark the agent unresponsive and fail later calls at
		// once). qemu-ga writes its reply and then goes back to its main
		// loop's poll: the shell waits until qemu-ga is in poll (7) or
		// ppoll (271) rather than for a time.
		marker := fmt.Sprintf("vmgate-agent-stopped-%d", time.Now().UnixNano())
		script := `until grep -qE '^(7|271) ' /proc/$PPID/syscall; do usleep 10000; done; kill -STOP $PPID && echo "$1" >/dev/console`
		if _, err := d.ExecStart(ctx, vmOther, hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", script, "sh", marker}}); err != nil {
			t.Fatalf("ExecStart(%s, kill -STOP qemu-ga) = %v", vmOther, err)
		}
		waitConsole(ctx, t, env.Domain(vmOther).SerialLog, marker)
		slot := mustLookup(t, d, vmOther).agentSlot

		type outcome struct {
			err       error
			took      time.Duration
			deadlined time.Duration
		}
		hung := make(chan outcome, 2)
		for _, dl := range []time.Duration{hungDeadline, hungDeadline + 2*time.Second} {
			// Two calls: the second waits for the domain's agent slot, bounded by its own deadline.
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), dl)
				defer cancel()
				start := time.Now()
				_, err := d.AgentInfo(ctx, vmOther)
				hung <- outcome{err, time.Since(start), dl}
			}()
		}
		// Both hung calls are under way once one holds the domain's agent slot.
		waitSlot(ctx, t, slot, true)
		err := otherAnswers(d, time.Minute)
		if err != nil {
			t.Errorf("Run(%s) while %s's agent hangs: %v", vmT1, vmOther, err)
		}
		if err == nil && len(hung) != 0 {
			t.Errorf("a hung call on %s returned (deadline %v) before Run(%s) answered; want %s to answer while the other agent hangs",
				vmOther, hungDeadline, vmT1, vmT1)
		}
		for range 2 {
			o := <-hung
			if !errors.Is(o.err, hypervisor.ErrTimeout) {
				t.Errorf("AgentInfo(%s) with a hung agent error %v; want %v", vmOther, o.err, hypervisor.ErrTimeout)
			}
			// A correctness bound (the deadline was honoured), not a speed claim.
			if o.took > o.deadlined+2*time.Second {
				t.Errorf("AgentInfo(%s) with deadline %v returned after %v; want within the deadline", vmOther, o.deadlined, o.took)
			}
		}
	})
}

// TestPower runs the power suite on the persistent domain, then checks that
// a transient domain cannot be started again once stopped.
func TestPower(t *testing.T) {
	_, d := envDriver(t, Config{})
	hypervisortest.RunPower(t, hypervisortest.Harness{Driver: d, VM: vmT1})

	t.Run("TransientStart", func(t *testing.T) {
		ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := d.Power(ctx, vmNoExec, hypervisor.PowerStop); err != nil {
			t.Fatalf("Power(%s, stop) = %v", vmNoExec, err)
		}
		if _, err := d.Status(ctx, vmNoExec); !errors.Is(err, hypervisor.ErrUnknownVM) {
			t.Errorf("Status(%s) after stopping a transient domain error %v; want %v", vmNoExec, err, hypervisor.ErrUnknownVM)
		}
		if err := d.Power(ctx, vmNoExec, hypervisor.PowerStart); !errors.Is(err, hypervisor.ErrNotSupported) {
			t.Errorf("Power(%s, start) after stop error %v; want %v", vmNoExec, err, hypervisor.ErrNotSupported)
		}
	})
}
