package server

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
	"github.com/vmgate/vmgate/plugins/qemu"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit/audittest"
	"github.com/vmgate/vmgate/policy/store/bolt"
	"github.com/vmgate/vmgate/server/mcptest"
)

// guestDir holds the vmgate-guest build the lab tests push; it is built on
// first use, so unit-test runs do not pay for it.
var (
	guestDir      string
	guestBuild    sync.Once
	guestBuildErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vmgate-server-guest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "server test:", err)
		os.Exit(2)
	}
	guestDir = dir
	code := labtest.Main(m, lab.Spec{Name: "srv"})
	os.RemoveAll(dir)
	os.Exit(code)
}

// buildGuest builds vmgate-guest for the lab guest into guestDir and points
// VMGATE_GUEST_DIR at it for the calling test.
func buildGuest(t *testing.T) {
	t.Helper()
	guestBuild.Do(func() {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(guestDir, guestctl.FileName("amd64")), "github.com/vmgate/vmgate/cmd/vmgate-guest")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
		if out, err := cmd.CombinedOutput(); err != nil {
			guestBuildErr = fmt.Errorf("building vmgate-guest: %v\n%s", err, out)
		}
	})
	if guestBuildErr != nil {
		t.Fatal(guestBuildErr)
	}
	t.Setenv(guestctl.GuestDirEnv, guestDir)
}

// labServer is a Server over the QEMU driver and the lab VM "srv" (as
// lab/srv), with grants alice and bob and a bbolt store that keeps the
// sessions.
func labServer(t *testing.T) (*fixture, hypervisor.Driver) {
	t.Helper()
	v := labtest.VM(t, "srv")
	buildGuest(t)
	d, err := qemu.New(qemu.Config{LabDir: filepath.Dir(v.Dir), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("qemu.New() = %v; want nil", err)
	}
	st, err := bolt.Open(filepath.Join(t.TempDir(), "state.db"), bolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	eng, err := policy.Parse("allow.json", []byte(mcptest.AllowAll))
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{rec: &audittest.Recorder{}, store: st}
	f.s, err = New(Config{
		Grants:   []Grant{{Name: "alice", Policy: eng}, {Name: "bob", Policy: eng}},
		Backends: []Backend{{Name: "lab", Driver: d}},
		Store:    st,
		Audit:    f.rec,
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { f.s.Close() }) // closes the driver too
	return f, d
}

// guestSh runs a shell line in the lab VM straight through the driver.
func guestSh(t *testing.T, d hypervisor.Driver, line string) string {
	t.Helper()
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := hypervisor.Run(ctx, d, "srv", hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", line}, Timeout: 50 * time.Second})
	if err != nil {
		t.Fatalf("sh %q: %v", line, err)
	}
	return string(res.Stdout)
}

func okCall(t *testing.T, f *fixture, grant, tool, args string) mcptest.Reply {
	t.Helper()
	r := f.sendAs(t, grant, mcptest.ToolCall(1, tool, args))
	if r.Result == nil || r.Result.IsError {
		t.Fatalf("%s as %s (%s) = %q; want success", tool, grant, args, r.Text())
	}
	return r
}

// sleepers returns the list_processes rows whose cmdline is "sleep 1000".
func sleepers(t *testing.T, f *fixture, args string) []map[string]any {
	t.Helper()
	r := okCall(t, f, "alice", "list_processes", args)
	var out []map[string]any
	for _, p := range r.Result.StructuredContent["processes"].([]any) {
		row := p.(map[string]any)
		if row["cmdline"] == "sleep 1000" {
			out = append(out, row)
		}
	}
	return out
}

func TestLabSessionTools(t *testing.T) {
	f, d := labServer(t)
	// A VM without the helper gets it pushed on first use.
	guestSh(t, d, "rm -f "+guestctl.GuestPath)
	r := okCall(t, f, "alice", "create_session", `{"vm":"lab/srv","ttl_s":3600}`)
	id := r.Result.StructuredContent["session"].(string)
	workdir := r.Result.StructuredContent["workdir"].(string)
	bin, err := guestctl.DefaultBinaries().Binary("amd64")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(guestSh(t, d, "sha256sum "+guestctl.GuestPath)); len(got) == 0 || got[0] != bin.SHA256 {
		t.Fatalf("guest helper sha256 after first use = %v; want the pushed build's %s", got, bin.SHA256)
	}
	t.Cleanup(func() {
		f.sendAs(t, "alice", mcptest.ToolCall(1, "destroy_session", fmt.Sprintf(`{"vm":"lab/srv","session":%q}`, id)))
	})

	sessArgs := fmt.Sprintf(`{"vm":"lab/srv","session":%q}`, id)
	okCall(t, f, "alice", "vm_agent_exec", fmt.Sprintf(`{"vm":"lab/srv","session":%q,"timeout_s":20,"shell":"echo data > file; setsid sh -c \"sleep 1000 &\" ; sleep 1000 &"}`, id))
	if got := len(sleepers(t, f, sessArgs)); got != 2 {
		t.Fatalf("list_processes --session shows %d sleep 1000; want 2 (one daemonized)", got)
	}
	if out := guestSh(t, d, "cat "+workdir+"/file"); out != "data\n" {
		t.Fatalf("session file = %q; want %q", out, "data\n")
	}

	// Another grant: the same answer as for a session that never existed.
	unknown := f.sendAs(t, "alice", mcptest.ToolCall(1, "destroy_session", `{"vm":"lab/srv","session":"00000000000000000000000000000000"}`)).Text()
	for _, tt := range []struct{ tool, args string }{
		{"list_processes", sessArgs},
		{"vm_agent_exec", fmt.Sprintf(`{"vm":"lab/srv","session":%q,"command":["touch","bob-was-here"]}`, id)},
		{"destroy_session", sessArgs},
	} {
		if got := f.sendAs(t, "bob", mcptest.ToolCall(1, tt.tool, tt.args)).Text(); got != unknown || !strings.Contains(got, "unknown session") {
			t.Errorf("bob's %s of alice's session = %q; want %q", tt.tool, got, unknown)
		}
	}
	if r := okCall(t, f, "bob", "list_sessions", `{}`); len(r.Result.StructuredContent["sessions"].([]any)) != 0 {
		t.Errorf("bob's list_sessions = %q; want none", r.Text())
	}
	if got := len(sleepers(t, f, sessArgs)); got != 2 {
		t.Fatalf("after bob's attempts alice's session has %d sleepers; want 2", got)
	}

	// Destroy: nothing of the session is left, its files are gone; twice is fine.
	r = okCall(t, f, "alice", "destroy_session", sessArgs)
	if r.Result.StructuredContent["existed"] != true {
		t.Errorf("destroy_session = %q; want existed", r.Text())
	}
	if got := sleepers(t, f, `{"vm":"lab/srv"}`); len(got) != 0 {
		t.Errorf("processes left after destroy_session: %v", got)
	}
	if out := guestSh(t, d, "ls -A "+filepath.Dir(workdir)); strings.Contains(out, id) {
		t.Errorf("workdir of %s left after destroy: %q", id, out)
	}
	if r = okCall(t, f, "alice", "destroy_session", sessArgs); !strings.Contains(r.Text(), "already gone") {
		t.Errorf("second destroy_session = %q; want already gone", r.Text())
	}
	if got := f.sendAs(t, "bob", mcptest.ToolCall(1, "destroy_session", sessArgs)).Text(); got != unknown {
		t.Errorf("bob's destroy of the destroyed session = %q; want %q", got, unknown)
	}
}

func TestLabKillProcess(t *testing.T) {
	f, d := labServer(t)
	call := func(args string) mcptest.Reply {
		return f.sendAs(t, "alice", mcptest.ToolCall(1, "kill_process", args))
	}
	qga := strings.TrimSpace(guestSh(t, d, "for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = qemu-ga ] && echo ${p#/proc/} && break; done"))
	kthread := strings.TrimSpace(guestSh(t, d, "cat /proc/2/comm >/dev/null && echo 2"))
	for _, tt := range []struct {
		pid, reason string
	}{{"1", "pid 1 is init"}, {kthread, "kernel thread"}, {qga, "guest agent"}} {
		r := call(fmt.Sprintf(`{"vm":"lab/srv","pid":%s,"signal":"KILL"}`, tt.pid))
		if !mcptest.HasTag(r, TagInvalid) || r.Text() != TagInvalid+" refused: "+tt.reason {
			t.Errorf("kill_process(pid %s) = %q; want %s refused: %s", tt.pid, r.Text(), TagInvalid, tt.reason)
		}
	}
	if strings.TrimSpace(guestSh(t, d, "cat /proc/"+qga+"/comm")) != "qemu-ga" {
		t.Fatalf("qemu-ga (pid %s) is gone after the refused kill", qga)
	}
	// A sleeping process: a stale started_at is refused, the right one kills it.
	okCall(t, f, "alice", "vm_agent_exec", `{"vm":"lab/srv","shell":"setsid sleep 1000 >/dev/null 2>&1 </dev/null &","timeout_s":20}`)
	rows := sleepers(t, f, `{"vm":"lab/srv"}`)
	if len(rows) != 1 {
		t.Fatalf("sleep 1000 processes = %v; want 1", rows)
	}
	pid, started := int64(rows[0]["pid"].(float64)), int64(rows[0]["started_at"].(float64))
	r := call(fmt.Sprintf(`{"vm":"lab/srv","pid":%d,"started_at":%d}`, pid, started-5000))
	if !mcptest.HasTag(r, TagInvalid) || !strings.Contains(r.Text(), "refused: pid was reused") {
		t.Errorf("kill_process with a stale started_at = %q; want %s refused: pid was reused", r.Text(), TagInvalid)
	}
	r = call(fmt.Sprintf(`{"vm":"lab/srv","pid":%d,"started_at":%d}`, pid, started))
	if r.Result == nil || r.Result.IsError || r.Result.StructuredContent["exited"] != true || !strings.Contains(r.Text(), "it exited") {
		t.Errorf("kill_process of the sleeper = %q; want it exited", r.Text())
	}
	if got := sleepers(t, f, `{"vm":"lab/srv"}`); len(got) != 0 {
		t.Errorf("sleep 1000 still there after the kill: %v", got)
	}
}
