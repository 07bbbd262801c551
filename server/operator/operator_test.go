package operator

import (
	"context"
	"errors"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/mcptest"
	"github.com/vmgate/vmgate/server/servertest"
)

const approvePolicy = `{"version":"1","default":"allow","tools":{"vm_power":{"action":"approve","approval":{"ttl":"10m"}}}}`

// startOperator serves f's operator socket in dir until the test ends.
func startOperator(t *testing.T, f *servertest.Fixture, dir string) *Listener {
	t.Helper()
	o, err := Listen(f.S, filepath.Join(dir, SocketName))
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- o.Serve(context.Background()) }()
	t.Cleanup(func() {
		if err := o.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return o
}

func TestOperatorGrantFlow(t *testing.T) {
	f := servertest.New(t, servertest.Options{Policy: approvePolicy})
	o := startOperator(t, f, t.TempDir())
	fi, err := os.Stat(o.Path())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode = %v; want a socket with 0600", fi.Mode())
	}
	args := `{"vm":"lab/vm1","action":"reboot"}`
	r := f.Call(t, "vm_power", args)
	if !mcptest.HasTag(r, catalog.TagApproval) {
		t.Fatalf("first call = %q; want %s", r.Text(), catalog.TagApproval)
	}
	id, _ := r.Result.StructuredContent["approval_id"].(string)
	ctx := context.Background()
	list, err := Call(ctx, o.Path(), Request{Op: OpList})
	if err != nil {
		t.Fatalf("Call(list) = %v", err)
	}
	if len(list.Approvals) != 1 || list.Approvals[0].ID != id || list.Approvals[0].State != store.ApprovalPending {
		t.Fatalf("list = %+v; want one pending approval %s", list.Approvals, id)
	}
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	if list.Operator != me.Username {
		t.Errorf("operator = %q; want %q (from the peer credentials)", list.Operator, me.Username)
	}
	resp, err := Call(ctx, o.Path(), Request{Op: OpGrant, ID: id, Reason: "planned reboot"})
	if err != nil {
		t.Fatalf("Call(grant) = %v", err)
	}
	if resp.Approval == nil || resp.Approval.State != store.ApprovalGranted {
		t.Fatalf("grant = %+v; want state granted", resp.Approval)
	}
	var audited bool
	for _, rec := range f.Rec.Records() {
		if rec.Transport == "operator" && rec.ApprovalID == id && rec.Decision == "approval_granted" &&
			strings.Contains(rec.Reason, me.Username) && strings.Contains(rec.Reason, "planned reboot") {
			audited = true
		}
	}
	if !audited {
		t.Errorf("no audit record of the grant by %s with its reason in %+v", me.Username, f.Rec.Records())
	}
	before := f.Calls.Load()
	if r := f.Call(t, "vm_power", args); r.Result == nil || r.Result.IsError {
		t.Fatalf("retry after grant = %q; want success", r.Text())
	}
	if f.Calls.Load() == before {
		t.Errorf("driver calls unchanged after the granted retry")
	}
	if r := f.Call(t, "vm_power", args); !mcptest.HasTag(r, catalog.TagApproval) {
		t.Errorf("second retry = %q; want %s (single use)", r.Text(), catalog.TagApproval)
	}
	// Granting the same approval again is refused by the store.
	if _, err := Call(ctx, o.Path(), Request{Op: OpGrant, ID: id}); err == nil {
		t.Errorf("second grant of %s succeeded; want an error", id)
	}
}

func TestOperatorDeny(t *testing.T) {
	f := servertest.New(t, servertest.Options{Policy: approvePolicy})
	o := startOperator(t, f, t.TempDir())
	args := `{"vm":"lab/vm1","action":"reset"}`
	r := f.Call(t, "vm_power", args)
	id, _ := r.Result.StructuredContent["approval_id"].(string)
	resp, err := Call(context.Background(), o.Path(), Request{Op: OpDeny, ID: id, Reason: "no"})
	if err != nil || resp.Approval == nil || resp.Approval.State != store.ApprovalDenied {
		t.Fatalf("deny = %+v, %v; want state denied", resp.Approval, err)
	}
	before := f.Calls.Load()
	if r := f.Call(t, "vm_power", args); r.Result == nil || !r.Result.IsError {
		t.Errorf("retry after deny = %q; want an error", r.Text())
	}
	if f.Calls.Load() != before {
		t.Errorf("the driver ran after a deny")
	}
}

// TestOperatorBadRequests sends hostile requests as raw lines: each gets an
// error and nothing is decided.
func TestOperatorBadRequests(t *testing.T) {
	f := servertest.New(t, servertest.Options{Policy: approvePolicy})
	o := startOperator(t, f, t.TempDir())
	r := f.Call(t, "vm_power", `{"vm":"lab/vm1","action":"reboot"}`)
	id, _ := r.Result.StructuredContent["approval_id"].(string)
	tests := []struct {
		name, line, want string
	}{
		{"empty", "", "empty request"},
		{"not json", "grant " + id, "bad request"},
		{"array", `["grant"]`, "JSON object"},
		{"unknown op", `{"op":"approve_all"}`, "unknown op"},
		{"unknown member", `{"op":"grant","id":"` + id + `","operator":"root"}`, "unknown member"},
		{"duplicate key", `{"op":"deny","op":"grant","id":"` + id + `"}`, "duplicate"},
		{"wrong type", `{"op":"grant","id":7}`, "must be a string"},
		{"no id", `{"op":"grant"}`, "needs an approval id"},
		{"unknown id", `{"op":"grant","id":"NOSUCHID"}`, "NOSUCHID"},
		{"NUL in id", `{"op":"grant","id":"a\u0000b"}`, "malformed approval id"},
		{"control in reason", `{"op":"grant","id":"` + id + `","reason":"a\nb"}`, "control characters"},
		{"list with id", `{"op":"list","id":"` + id + `"}`, "no id"},
		{"undo without call", `{"op":"undo"}`, "undo takes a call id"},
		{"undo with reason", `{"op":"undo","id":"ABCDEFGHIJKLMN","reason":"x"}`, "undo takes a call id and no reason"},
		{"undo path", `{"op":"undo","id":"../../etc/passwd"}`, "is not a call id"},
		{"undo unknown call", `{"op":"undo","id":"ABCDEFGHIJKLMNOPQRSTUVWXYZ"}`, "no undo snapshot"},
		{"huge", `{"op":"grant","id":"` + strings.Repeat("A", maxRequest) + `"}`, "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("unix", o.Path())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if tt.line != "" {
				if _, err := c.Write([]byte(tt.line + "\n")); err != nil {
					t.Fatal(err)
				}
			}
			c.(*net.UnixConn).CloseWrite()
			line, err := readLine(c, 1<<20)
			if err != nil {
				t.Fatalf("no response: %v", err)
			}
			if !strings.Contains(string(line), `"error"`) || !strings.Contains(string(line), tt.want) {
				t.Errorf("response to %.60q = %s; want an error containing %q", tt.line, line, tt.want)
			}
		})
	}
	list, err := f.S.Approvals().List(context.Background())
	if err != nil || len(list) != 1 || list[0].State != store.ApprovalPending {
		t.Errorf("approvals after the bad requests = %+v, %v; want the one still pending", list, err)
	}
	for _, rec := range f.Rec.Records() {
		if rec.Transport == "operator" {
			t.Errorf("a bad request was recorded as a decision: %+v", rec)
		}
	}
}

func TestOperatorSocketLifecycle(t *testing.T) {
	dir := t.TempDir()
	f := servertest.New(t, servertest.Options{})
	path := filepath.Join(dir, SocketName)

	// A stale socket of a crashed server (bound, then its listener gone
	// without unlinking) is replaced.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	o, err := Listen(f.S, path)
	if err != nil {
		t.Fatalf("ListenOperator over a stale socket = %v; want it replaced", err)
	}
	go o.Serve(context.Background())
	if _, err := Call(context.Background(), path, Request{Op: OpList}); err != nil {
		t.Errorf("list on the new socket = %v", err)
	}

	// A second server on the same state directory is refused and leaves the
	// first one's socket alone.
	g := servertest.New(t, servertest.Options{})
	if _, err := Listen(g.S, path); !errors.Is(err, ErrBusy) {
		t.Errorf("second ListenOperator = %v; want ErrBusy", err)
	}
	if _, err := Call(context.Background(), path, Request{Op: OpList}); err != nil {
		t.Errorf("first server's socket broken by the second: %v", err)
	}

	if err := o.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after Close: %v; want it removed", err)
	}
	if _, err := Call(context.Background(), path, Request{Op: OpList}); err == nil {
		t.Errorf("OperatorCall after Close succeeded")
	}

	// A regular file in the socket's place is never removed.
	if err := os.WriteFile(path, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(g.S, path); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("ListenOperator over a regular file = %v; want a 'not a socket' error", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "keep" {
		t.Errorf("regular file after refused ListenOperator = %q, %v; want it unchanged", b, err)
	}
	long := filepath.Join(dir, strings.Repeat("d", 120), SocketName)
	if _, err := Listen(g.S, long); err == nil {
		t.Errorf("ListenOperator(%d-byte path) succeeded; want an error", len(long))
	}
}
