package hypervisor

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/status"

	pb "github.com/vmgate/vmgate/hypervisor/proto"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// parseTxtar reads the txtar format (a comment, then "-- name --" lines each
// starting a file) into a map of file name to content.
func parseTxtar(data string) map[string]string {
	files := map[string]string{}
	name := ""
	for _, line := range strings.SplitAfter(data, "\n") {
		if n, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "-- "); ok && strings.HasSuffix(n, " --") {
			name = strings.TrimSuffix(n, " --")
			files[name] = ""
			continue
		}
		if name != "" {
			files[name] += line
		}
	}
	return files
}

// TestErrorStatusGolden pins the wire form of every driver error: the gRPC
// code, message and ErrorDetail a plugin sends, one txtar file per case.
func TestErrorStatusGolden(t *testing.T) {
	cases := []struct {
		name string
		err  error
	}{
		{"unknown_vm", fmt.Errorf("qemu: status: %w: \"vm9\"", ErrUnknownVM)},
		{"unknown_exec", fmt.Errorf("qemu: exec status: %w", ErrUnknownExec)},
		{"command_disabled", fmt.Errorf("qemu: exec: %w", &CommandDisabledError{Command: "guest-exec"})},
		{"agent_unavailable", fmt.Errorf("qemu: ping: %w", ErrAgentUnavailable)},
		{"vm_not_running", fmt.Errorf("qemu: exec: %w", ErrVMNotRunning)},
		{"not_configured", ErrNotConfigured},
		{"timeout", fmt.Errorf("qemu: exec: %w: %w", ErrTimeout, context.DeadlineExceeded)},
		{"not_supported", fmt.Errorf("qemu: power start: %w", ErrNotSupported)},
		{"invalid_argument", fmt.Errorf("qemu: file read: %w: empty path", ErrInvalidArgument)},
		{"plugin_exited", &ExitedError{Driver: "libvirt"}},
		{"canceled", fmt.Errorf("qemu: %w", context.Canceled)},
		{"plain", errors.New("qemu: something odd")},
		{"snapshot_not_found", fmt.Errorf("qemu: snapshot revert: %w: \"before\"", ErrSnapshotNotFound)},
		{"snapshot_exists", fmt.Errorf("libvirt: snapshot create: %w: \"before\"", ErrSnapshotExists)},
		{"snapshot_memory", fmt.Errorf("virtualbox: snapshot create: %w", ErrSnapshotMemory)},
		{"snapshot_disk_only", fmt.Errorf("qemu: snapshot create: %w", ErrSnapshotDiskOnly)},
		{"not_created", fmt.Errorf("qemu: delete vm1: %w", ErrNotCreated)},
	}
	var b strings.Builder
	b.WriteString("Wire form of driver errors (go test ./hypervisor -run TestErrorStatusGolden -update rewrites it).\n")
	for _, c := range cases {
		st, ok := status.FromError(toStatus(c.err))
		if !ok {
			t.Fatalf("toStatus(%v) is not a status error", c.err)
		}
		fmt.Fprintf(&b, "-- %s --\ncode: %s\nmessage: %s\n", c.name, st.Code(), st.Message())
		for _, d := range st.Details() {
			ed, ok := d.(*pb.ErrorDetail)
			if !ok {
				t.Fatalf("toStatus(%v) detail %T; want *ErrorDetail", c.err, d)
			}
			kinds := strings.Join(ed.GetKinds(), " ")
			if kinds == "" {
				kinds = "(none)"
			}
			fmt.Fprintf(&b, "kinds: %s\n", kinds)
			if ed.GetCommand() != "" {
				fmt.Fprintf(&b, "command: %s\n", ed.GetCommand())
			}
		}
	}
	path := filepath.Join("testdata", "errors.txtar")
	if *update {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	got, wantFiles := parseTxtar(b.String()), parseTxtar(string(want))
	if len(got) != len(wantFiles) {
		t.Errorf("%d cases; golden has %d", len(got), len(wantFiles))
	}
	for name, g := range got {
		if w, ok := wantFiles[name]; !ok || g != w {
			t.Errorf("wire form of %s =\n%s\nwant\n%s", name, g, w)
		}
	}
}

func TestParseTxtar(t *testing.T) {
	got := parseTxtar("comment\n-- a --\nx\ny\n-- b --\n-- c --\nz\n")
	want := map[string]string{"a": "x\ny\n", "b": "", "c": "z\n"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parseTxtar() = %q; want %q", got, want)
	}
}
