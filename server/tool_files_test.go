package server

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/server/mcptest"
)

// guestFiles answers vmgate-guest's file commands for a guest with
//
//	/tmp/ok                   a plain file
//	/tmp/link   -> /root/secret
//	/tmp/inside -> /tmp/ok
//
// the way guest/agent/files.go does (its own tests hold the real thing).
func guestFiles(argv []string, stdin []byte) hypervisor.ExecResult {
	links := map[string]string{"/tmp/link": "/root/secret", "/tmp/inside": "/tmp/ok"}
	p := flag(argv, "--path")
	switch argv[2] {
	case "stat":
		real := p
		if t, ok := links[p]; ok && slices.Contains(argv, "--follow-symlinks") {
			real = t
		} else if ok {
			return replyErr(wire.CodeRefused, wire.ReasonSymlink, "file stat: refused: "+p+" is a symlink")
		}
		return reply(wire.FileInfo{Path: real, Exists: true, Type: "file", Mode: 0o644})
	case "read":
		if _, ok := links[p]; ok {
			return replyErr(wire.CodeRefused, wire.ReasonSymlink, "file read: refused: "+p+" is a symlink (to \""+links[p]+"\"), its last component of "+p)
		}
		n, _ := strconv.Atoi(flag(argv, "--max-bytes"))
		data := "content"[:min(n, 7)]
		r := reply(wire.FileRead{FileInfo: wire.FileInfo{Path: p, Exists: true, Type: "file", Mode: 0o644, Size: 7}, Bytes: int64(len(data)), Truncated: n < 7})
		r.Stdout = append(append(r.Stdout, '\n'), data...) // --raw: the data after the reply's line
		return r
	case "write":
		if _, ok := links[p]; ok {
			return replyErr(wire.CodeRefused, wire.ReasonSymlink, "file write: refused: "+p+" is a symlink")
		}
		return reply(wire.FileWritten{FileInfo: wire.FileInfo{Path: p, Exists: true, Type: "file", Mode: 0o644}, Bytes: int64(len(stdin)), Created: true})
	}
	return replyErr(wire.CodeInvalid, "", "unknown file command")
}

func TestFileToolsResolveInTheGuest(t *testing.T) {
	const tmpOnly = `{"version":"1","default":"deny","tools":{
	  "vm_file_read":{"require":[{"path":"args.path","op":"glob","value":"/tmp/*"}]%s},
	  "vm_file_write":{"require":[{"path":"args.path","op":"glob","value":"/tmp/*"}]%s}}}`
	follow := `,"files":{"follow_symlinks":true}`
	tests := []struct {
		name, policy, tool, args string
		tag, text                string   // tag "" is success; text is part of the reply's text
		argv                     []string // the last file command the guest ran ("" none)
	}{
		{"symlink to a root file refused", fmtPolicy(tmpOnly, "", ""), "vm_file_read", `{"vm":"lab/vm1","path":"/tmp/link"}`,
			TagDenied, "/tmp/link is a symlink", []string{"file", "read", "--path", "/tmp/link", "--max-bytes", "1048576", "--raw"}},
		{"followed symlink re-decided on the real path", fmtPolicy(tmpOnly, follow, ""), "vm_file_read", `{"vm":"lab/vm1","path":"/tmp/link"}`,
			TagDenied, "leads through symlinks to /root/secret, which the policy does not allow", []string{"file", "stat", "--path", "/tmp/link", "--follow-symlinks"}},
		{"followed symlink inside the rules", fmtPolicy(tmpOnly, follow, ""), "vm_file_read", `{"vm":"lab/vm1","path":"/tmp/inside"}`,
			"", "content", []string{"file", "read", "--path", "/tmp/ok", "--max-bytes", "1048576", "--raw"}},
		{"plain read", fmtPolicy(tmpOnly, "", ""), "vm_file_read", `{"vm":"lab/vm1","path":"/tmp/ok","max_bytes":5}`,
			"", "conte\n(truncated)", []string{"file", "read", "--path", "/tmp/ok", "--max-bytes", "5", "--raw"}},
		{"dotdot", fmtPolicy(tmpOnly, "", ""), "vm_file_read", `{"vm":"lab/vm1","path":"/tmp/x/../../root/secret"}`,
			TagInvalid, `"/tmp/x/../../root/secret" is not clean (want "/root/secret")`, nil}, // before the policy sees it
		{"dotdot inside the glob", `{"version":"1","default":"allow"}`, "vm_file_read", `{"vm":"lab/vm1","path":"/tmp/link/../secret"}`,
			TagInvalid, "not clean", nil},
		{"relative", `{"version":"1","default":"allow"}`, "vm_file_write", `{"vm":"lab/vm1","path":"tmp/x","content":"a"}`,
			TagInvalid, `"tmp/x" is not absolute`, nil},
		{"write over a symlink", fmtPolicy(tmpOnly, "", ""), "vm_file_write", `{"vm":"lab/vm1","path":"/tmp/link","content":"root::0:0::/:/bin/sh"}`,
			TagDenied, "/tmp/link is a symlink", []string{"file", "write", "--path", "/tmp/link", "--size", "20", "--create-mode", "420"}},
		{"setuid refused before the guest", fmtPolicy(tmpOnly, "", ""), "vm_file_write", `{"vm":"lab/vm1","path":"/tmp/x","content":"a","mode":2559}`,
			TagDenied, "mode 04777 sets setuid", nil},
		{"sticky refused", fmtPolicy(tmpOnly, "", ""), "vm_file_write", `{"vm":"lab/vm1","path":"/tmp/x","content":"a","mode":1023}`,
			TagDenied, "setuid, setgid or sticky", nil},
		{"no mode: 0644 for a new file", fmtPolicy(tmpOnly, "", ""), "vm_file_write", `{"vm":"lab/vm1","path":"/tmp/x","content":"abc"}`,
			"", "mode 0644", []string{"file", "write", "--path", "/tmp/x", "--size", "3", "--create-mode", "420"}},
		{"the policy's default mode", fmtPolicy(tmpOnly, "", `,"files":{"default_mode":"0600"}`), "vm_file_write", `{"vm":"lab/vm1","path":"/tmp/x","content":"abc"}`,
			"", "wrote 3 bytes", []string{"file", "write", "--path", "/tmp/x", "--size", "3", "--create-mode", "384"}},
		{"setgid when the policy allows", fmtPolicy(tmpOnly, "", `,"files":{"special_bits":true}`), "vm_file_write", `{"vm":"lab/vm1","path":"/tmp/x","content":"abc","mode":1517}`,
			"", "wrote 3 bytes", []string{"file", "write", "--path", "/tmp/x", "--size", "3", "--create-mode", "420", "--mode", "1517", "--special-bits"}},
		{"write through a followed symlink re-decided", fmtPolicy(tmpOnly, "", follow), "vm_file_write", `{"vm":"lab/vm1","path":"/tmp/link","content":"x"}`,
			TagDenied, "leads through symlinks to /root/secret", []string{"file", "stat", "--path", "/tmp/link", "--follow-symlinks", "--write"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newSessFixture(t, haveBins(), tc.policy)
			f.guest.file = guestFiles
			r := f.as(t, "alice", tc.tool, tc.args)
			switch {
			case tc.tag == "" && (r.Result == nil || r.Result.IsError):
				t.Errorf("%s(%s) = %q; want success", tc.tool, tc.args, r.Text())
			case tc.tag != "" && !mcptest.HasTag(r, tc.tag):
				t.Errorf("%s(%s) = %q; want %s", tc.tool, tc.args, r.Text(), tc.tag)
			case !strings.Contains(r.Text(), tc.text):
				t.Errorf("%s(%s) = %q; want it to say %q", tc.tool, tc.args, r.Text(), tc.text)
			}
			var last []string
			for _, a := range f.guest.argvs {
				if len(a) > 2 && a[1] == "file" {
					last = a[1:]
				}
			}
			if !slices.Equal(last, tc.argv) {
				t.Errorf("%s(%s): last file command %q; want %q", tc.tool, tc.args, last, tc.argv)
			}
		})
	}
}

// TestFileToolsWithoutHelperFailClosed: a host without vmgate-guest builds
// refuses the file tools; the driver's file channel (which follows
// symlinks) is never used for them.
func TestFileToolsWithoutHelperFailClosed(t *testing.T) {
	f := newSessFixture(t, noBins(), "")
	for _, c := range []struct{ tool, args string }{
		{"vm_file_read", `{"vm":"lab/vm1","path":"/tmp/link"}`},
		{"vm_file_write", `{"vm":"lab/vm1","path":"/tmp/link","content":"x"}`},
	} {
		if r := f.as(t, "alice", c.tool, c.args); !mcptest.HasTag(r, TagBackend) || !strings.Contains(r.Text(), "vmgate-guest") {
			t.Errorf("%s without builds = %q; want %s naming vmgate-guest", c.tool, r.Text(), TagBackend)
		}
	}
	if n := len(f.guest.argvs); n != 0 {
		t.Errorf("the guest ran %d commands (%q); want none", n, f.guest.argvs)
	}
}

func fmtPolicy(doc, read, write string) string {
	return strings.Replace(strings.Replace(doc, "%s", read, 1), "%s", write, 1)
}

// TestFollowedPathNeedsItsOwnApproval: an approval is for the path as the
// operator saw it; when it leads through a symlink elsewhere, the call is
// refused and names the real path to ask for.
func TestFollowedPathNeedsItsOwnApproval(t *testing.T) {
	f := newSessFixture(t, haveBins(), `{"version":"1","default":"deny","tools":{
	  "vm_file_read":{"action":"approve","files":{"follow_symlinks":true}}}}`)
	f.guest.file = guestFiles
	args := `{"vm":"lab/vm1","path":"/tmp/inside"}`
	r := f.as(t, "alice", "vm_file_read", args)
	id, _ := r.Result.StructuredContent["approval_id"].(string)
	if !mcptest.HasTag(r, TagApproval) || id == "" {
		t.Fatalf("first call = %q; want %s with an approval id", r.Text(), TagApproval)
	}
	if _, err := f.s.Approvals().Grant(context.Background(), id, "alice", "ok"); err != nil {
		t.Fatal(err)
	}
	r = f.as(t, "alice", "vm_file_read", args)
	if !mcptest.HasTag(r, TagDenied) || !strings.Contains(r.Text(), `needs an approval of its own: call again with path "/tmp/ok"`) {
		t.Errorf("approved call through a symlink = %q; want %s naming /tmp/ok", r.Text(), TagDenied)
	}
	if n := f.guest.count(guestctl.GuestPath, "file", "read"); n != 0 {
		t.Errorf("the guest read %d times; want none", n)
	}
}

// TestFileModeAsGiven: vm_file_write takes mode as a number, and both file
// tools report it as that number (with its octal spelling beside it), as
// their outputSchema says.
func TestFileModeAsGiven(t *testing.T) {
	f := newSessFixture(t, haveBins(), `{"version":"1","default":"allow"}`)
	f.guest.file = guestFiles
	for _, c := range []struct{ tool, args string }{
		{"vm_file_write", `{"vm":"lab/vm1","path":"/tmp/x","content":"abc","mode":420}`},
		{"vm_file_read", `{"vm":"lab/vm1","path":"/tmp/ok"}`},
	} {
		r := f.as(t, "alice", c.tool, c.args)
		if r.Result == nil || r.Result.IsError {
			t.Fatalf("%s(%s) = %q; want success", c.tool, c.args, r.Text())
		}
		sc := r.Result.StructuredContent
		if sc["mode"] != float64(0o644) || sc["mode_octal"] != "0644" {
			t.Errorf("%s(%s): mode %#v, mode_octal %#v; want 420 (the number mode takes) and \"0644\"", c.tool, c.args, sc["mode"], sc["mode_octal"])
		}
	}
}

// TestFileNotFoundReadme: a missing file's read answers what README shows,
// with no hint about commands and PATH (that hint is for vm_agent_exec).
func TestFileNotFoundReadme(t *testing.T) {
	f := newSessFixture(t, haveBins(), `{"version":"1","default":"allow"}`)
	f.guest.file = func(argv []string, stdin []byte) hypervisor.ExecResult {
		if p := flag(argv, "--path"); p == "/nope" {
			// guest/agent/files.go's fileErr for ENOENT
			return replyErr(wire.CodeNotFound, "", "file "+argv[2]+": "+p+": no such file or directory")
		}
		return guestFiles(argv, stdin)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	r := f.as(t, "alice", "vm_file_read", `{"vm":"lab/vm1","path":"/nope"}`)
	got := r.Text()
	if !mcptest.HasTag(r, TagInvalid) || strings.Contains(got, "PATH") {
		t.Errorf("vm_file_read of a missing file = %q; want %s without a PATH hint", got, TagInvalid)
	}
	if !strings.Contains(string(readme), "`"+got+"`") {
		t.Errorf("vm_file_read of a missing file = %q; README does not show it as it is", got)
	}
}
