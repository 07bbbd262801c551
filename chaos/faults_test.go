package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/pluginhost"
	"github.com/vmgate/vmgate/internal/redistest"
	"github.com/vmgate/vmgate/internal/testload"
	"github.com/vmgate/vmgate/plugins/qemu"
)

// faultPolicy allows what the fault scenarios need, shell included (the
// qemu-ga kill goes through it), with a counter on every tool so that
// every call needs the store.
const faultPolicy = `{
  "version": "1",
  "default": "deny",
  "all_tools": { "limits": [ { "counter": "all", "window": "minute", "max": 100000, "scope": "grant" } ] },
  "tools": { "list_vms": {}, "vm_status": {}, "vm_agent_exec": {} }
}
`

var faultsSurvived []string

func survived(name string) { faultsSurvived = append(faultsSurvived, name) }

// faultServer starts a server for one fault scenario.
func faultServer(t *testing.T, o configOpts) (*serveProc, *httpClient, setup) {
	t.Helper()
	token := newToken()
	o.grants = []grantSpec{{name: "agent", token: token, policy: faultPolicy}}
	s := writeConfig(t, o)
	p := startServe(t, s.cfg)
	c := newHTTPClient(p.url, token)
	if err := c.initialize(context.Background()); err != nil {
		t.Fatal(err)
	}
	return p, c, s
}

// until calls f every 250 ms until it succeeds or d (for an idle machine,
// scaled with its load) has passed, and returns f's last error.
func until(d time.Duration, f func() error) error {
	deadline := time.Now().Add(testload.Scale(d))
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func callOutcome(c *httpClient, tool string, args map[string]any) (reply, string, error) {
	r, err := c.call(context.Background(), tool, args)
	if err != nil {
		return r, "", err
	}
	return r, r.outcome(), nil
}

func expectOK(c *httpClient, tool string, args map[string]any) error {
	r, got, err := callOutcome(c, tool, args)
	if err != nil {
		return err
	}
	if got != "ok" {
		return fmt.Errorf("%s = %s (%.200s); want ok", tool, got, r.Body)
	}
	return nil
}

// TestFaults injects one fault at a time and checks that calls are refused
// with a clear reason (never let through, never hung) and work again after.
func TestFaults(t *testing.T) {
	labtest.RequireQEMU(t)
	binary(t)
	v1, v2 := labtest.VM(t, vm1), labtest.VM(t, vm2)
	defer func() {
		report.add("faults", "audit disk full, Redis down, plugin killed, VM paused, qemu-ga killed",
			fmt.Sprintf("survived %d of 5: %s", len(faultsSurvived), strings.Join(faultsSurvived, ", ")))
	}()

	t.Run("audit-disk-full", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("mounting a tmpfs needs root")
		}
		dir := t.TempDir()
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", dir).CombinedOutput(); err != nil {
			t.Fatalf("mount tmpfs: %v: %s", err, out)
		}
		p, c, s := faultServer(t, configOpts{auditDir: dir, vms: []*lab.VM{v1}})
		t.Cleanup(func() {
			p.kill()
			if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
				t.Errorf("umount %s: %v: %s", dir, err, out)
			}
		})
		if err := expectOK(c, "list_vms", map[string]any{}); err != nil {
			t.Fatal(err)
		}
		filler := filepath.Join(dir, "filler")
		f, err := os.Create(filler)
		if err != nil {
			t.Fatal(err)
		}
		chunk := make([]byte, 4096)
		for {
			if _, err := f.Write(chunk); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("filling the tmpfs: %v", err)
				}
				break
			}
		}
		f.Close()
		// tmpfs allocates whole pages: the log's last page may still take a
		// record or two, so a call may still pass; but a call whose decision
		// record cannot be written must be refused, naming the audit log.
		okWhileFull, refused := 0, 0
		for range 20 {
			r, got, err := callOutcome(c, "list_vms", map[string]any{})
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case got == "ok":
				okWhileFull++
			case got == "[POLICY DENIED]" && strings.Contains(r.Result.text(), "audit"):
				refused++
			default:
				t.Errorf("call with the audit disk full = %s %q; want ok or [POLICY DENIED] naming the audit log", got, r.Body)
			}
		}
		if refused < 10 {
			t.Errorf("%d of 20 calls refused with the audit disk full; want at least 10", refused)
		}
		t.Logf("audit disk full: %d calls refused, %d passed (their records fit the last page)", refused, okWhileFull)
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		if err := until(10*time.Second, func() error { return expectOK(c, "list_vms", map[string]any{}) }); err != nil {
			t.Fatalf("after freeing the audit disk: %v", err)
		}
		if err := p.stop(); err != nil {
			t.Fatal(err)
		}
		if _, err := verifyLog(s.auditLog, filepath.Join(s.dir, "audit.key")); err != nil {
			t.Error(err)
		}
		recs, err := readLogs(s.auditLog)
		if err != nil {
			t.Fatal(err)
		}
		pr := checkPairs(recs)
		if pr.allowed != okWhileFull+2 {
			t.Errorf("the log holds %d allowed calls; the clients saw %d go through", pr.allowed, okWhileFull+2)
		}
		t.Logf("outcome records lost to the full disk: %d (decisions lost: 0)", len(pr.missing))
		report.add("faults", "audit disk full (tmpfs): refused / passed / outcomes lost", fmt.Sprintf("%d / %d / %d", refused, okWhileFull, len(pr.missing)))
		if !t.Failed() {
			survived("audit disk full")
		}
	})

	t.Run("redis-down", func(t *testing.T) {
		addr, stop, restart := redistest.Start(t)
		p, c, _ := faultServer(t, configOpts{store: "redis", redisURL: "redis://" + addr, prefix: "faults:", vms: []*lab.VM{v1}})
		if err := expectOK(c, "list_vms", map[string]any{}); err != nil {
			t.Fatal(err)
		}
		stop()
		for i := range 3 {
			r, got, err := callOutcome(c, "list_vms", map[string]any{})
			if err != nil {
				t.Fatal(err)
			}
			if got != "[POLICY DENIED]" || !strings.Contains(r.Result.text(), "store") {
				t.Errorf("call %d with Redis down = %s %q; want [POLICY DENIED] naming the store", i, got, r.Body)
			}
		}
		restart()
		if err := until(20*time.Second, func() error { return expectOK(c, "list_vms", map[string]any{}) }); err != nil {
			t.Fatalf("after Redis came back: %v", err)
		}
		if err := p.stop(); err != nil {
			t.Error(err)
		}
		if !t.Failed() {
			survived("Redis down")
		}
	})

	t.Run("plugin-killed", func(t *testing.T) {
		// vmgate serve runs its drivers in process for now, so the plugin is
		// launched here through the same host the server will use.
		h := pluginhost.New(pluginhost.Options{Registry: pluginhost.Registered(), Executable: vmgateBin, MinBackoff: 50 * time.Millisecond})
		defer h.Close()
		cfg, _ := json.Marshal(qemu.Settings{VMs: []qemu.VMSettings{{Name: vm1, QMP: v1.QMPSocket, QGA: v1.QGASocket}}})
		ctx, cancel := testload.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		d, err := h.Launch(ctx, pluginhost.Spec{Driver: "qemu", Backend: "lab", Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Status(ctx, vm1); err != nil {
			t.Fatal(err)
		}
		var plugin int
		for _, k := range descendants(os.Getpid()) {
			if strings.HasPrefix(k.cmdline, vmgateBin+" plugin qemu") {
				plugin = k.pid
			}
		}
		if plugin == 0 {
			t.Fatalf("no plugin process below the test: %v", descendants(os.Getpid()))
		}
		if err := syscall.Kill(plugin, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for alive(plugin) {
			time.Sleep(10 * time.Millisecond)
		}
		// The call that meets the dead plugin may fail; the next one works.
		if _, err := d.Status(ctx, vm1); err != nil {
			t.Logf("first call after the kill: %v", err)
			if _, err := d.Status(ctx, vm1); err != nil {
				t.Fatalf("second call after the plugin was killed: %v", err)
			}
		}
		if !t.Failed() {
			survived("plugin killed")
		}
	})

	t.Run("vm-paused", func(t *testing.T) {
		p, c, _ := faultServer(t, configOpts{vms: []*lab.VM{v1, v2}})
		echo := func(vm string, timeout int) (time.Duration, string, reply, error) {
			start := time.Now()
			r, got, err := callOutcome(c, "vm_agent_exec", map[string]any{"vm": "lab/" + vm, "command": []string{"echo", "x"}, "timeout_s": timeout})
			if err == nil && got != "ok" && got != "[TIMED OUT]" && got != "[BACKEND ERROR]" {
				err = fmt.Errorf("exec on %s = %s %.200s", vm, got, r.Body)
			}
			return time.Since(start), got, r, err
		}
		median := func(vm string) (time.Duration, error) {
			var ds []time.Duration
			for range 5 {
				d, got, _, err := echo(vm, 10)
				if err != nil || got != "ok" {
					return 0, fmt.Errorf("exec on %s: %s %v", vm, got, err)
				}
				ds = append(ds, d)
			}
			slices.Sort(ds)
			return ds[2], nil
		}
		if _, _, _, err := echo(vm2, 10); err != nil {
			t.Fatal(err)
		}
		base, err := median(vm1)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := qmp(ctx, v2.QMPSocket, "stop"); err != nil {
			t.Fatal(err)
		}
		defer qmp(ctx, v2.QMPSocket, "cont")
		type res struct {
			d      time.Duration
			got    string
			status int
			body   string
			err    error
		}
		paused := make(chan res, 1)
		go func() {
			d, got, r, err := echo(vm2, 2)
			paused <- res{d, got, r.Status, string(r.Body), err}
		}()
		during, err := median(vm1)
		if err != nil {
			t.Fatal(err)
		}
		pr := <-paused
		// The deadline of an exec is its timeout plus 15 s to collect output.
		if deadline := 17*time.Second + 3*time.Second; pr.err != nil || pr.got == "ok" || pr.d > deadline {
			t.Errorf("exec on the paused VM = %s (HTTP %d, body %q) after %v (%v); want [TIMED OUT] or [BACKEND ERROR] within %v", pr.got, pr.status, pr.body, pr.d, pr.err, deadline)
		}
		ratio := float64(during) / float64(base)
		t.Logf("exec on the other VM: median %v before, %v while paused (%.2f×); paused VM answered %s in %v", base, during, ratio, pr.got, pr.d)
		if ratio > 10 {
			t.Errorf("exec on the running VM slowed %.2f× while the other was paused; want at most 10×", ratio)
		}
		if err := qmp(ctx, v2.QMPSocket, "cont"); err != nil {
			t.Fatal(err)
		}
		if err := until(60*time.Second, func() error {
			return expectOK(c, "vm_agent_exec", map[string]any{"vm": "lab/" + vm2, "command": []string{"echo", "back"}, "timeout_s": 5})
		}); err != nil {
			t.Fatalf("after cont: %v", err)
		}
		if err := p.stop(); err != nil {
			t.Error(err)
		}
		report.add("faults", "exec latency on a VM while another is paused (median of 5)", fmt.Sprintf("%v → %v (%.2f×); paused VM: %s in %v", base.Round(time.Millisecond), during.Round(time.Millisecond), ratio, pr.got, pr.d.Round(time.Millisecond)))
		if !t.Failed() {
			survived("VM paused")
		}
	})

	t.Run("qemu-ga-killed", func(t *testing.T) {
		p, c, _ := faultServer(t, configOpts{vms: []*lab.VM{v2}})
		if err := expectOK(c, "vm_agent_exec", map[string]any{"vm": "lab/" + vm2, "command": []string{"echo", "x"}}); err != nil {
			t.Fatal(err)
		}
		r, got, err := callOutcome(c, "vm_agent_exec", map[string]any{"vm": "lab/" + vm2, "shell": "kill $(pidof qemu-ga)", "timeout_s": 5})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("the kill itself: %s %.200s", got, r.Body)
		var seen []string
		err = until(90*time.Second, func() error {
			start := time.Now()
			r, got, err := callOutcome(c, "vm_agent_exec", map[string]any{"vm": "lab/" + vm2, "command": []string{"echo", "x"}, "timeout_s": 5})
			if err != nil {
				return err
			}
			if d := time.Since(start); d > 25*time.Second {
				t.Errorf("a call while qemu-ga was down took %v; want the deadline (20 s)", d)
			}
			if got != "ok" {
				seen = append(seen, got)
				if got == "[UNTAGGED]" || r.Result == nil || len(r.Result.text()) < 10 {
					t.Errorf("error while qemu-ga was down is not clear: %.300s", r.Body)
				}
				return fmt.Errorf("%s", got)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("qemu-ga never came back: %v (errors seen: %v)", err, seen)
		}
		t.Logf("errors seen while qemu-ga was down: %v", seen)
		if err := p.stop(); err != nil {
			t.Error(err)
		}
		if !t.Failed() {
			survived("qemu-ga killed")
		}
	})
}
