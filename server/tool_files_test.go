package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
		off, _ := strconv.Atoi(flag(argv, "--offset"))
		n, _ := strconv.Atoi(flag(argv, "--length"))
		const content = "content"
		data := content[min(off, 7):min(off+n, 7)]
		fr := wire.FileRead{FileInfo: wire.FileInfo{Path: p, Exists: true, Type: "file", Mode: 0o644, Size: 7}, Bytes: int64(len(data)), Offset: int64(off), Truncated: off+n < 7, EOF: off+n >= 7}
		if slices.Contains(argv, "--hash") {
			fr.SHA256 = sha256Hex(content)
		}
		return replyData(fr, []byte(data))
	case "write":
		if _, ok := links[p]; ok {
			return replyErr(wire.CodeRefused, wire.ReasonSymlink, "file write: refused: "+p+" is a symlink")
		}
		if e := flag(argv, "--expect-sha256"); e != "" && e != sha256Hex("content") {
			return replyErr(wire.CodeRefused, wire.ReasonChanged, "file write: refused: "+p+" changed: its sha256 is not "+e)
		}
		fw := wire.FileWritten{FileInfo: wire.FileInfo{Path: p, Exists: true, Type: "file", Mode: 0o644}, Bytes: int64(len(stdin)), Created: true, Atomic: true}
		if o := flag(argv, "--offset"); o != "" || slices.Contains(argv, "--append") {
			fw.Offset, _ = strconv.ParseInt(o, 10, 64)
			fw.Created, fw.Atomic = false, false
		}
		return reply(fw)
	}
	return replyErr(wire.CodeInvalid, "", "unknown file command")
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
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
			TagDenied, "/tmp/link is a symlink", []string{"file", "read", "--path", "/tmp/link", "--offset", "0", "--length", "1048576"}},
		{"followed symlink re-decided on the real path", fmtPolicy(tmpOnly, follow, ""), "vm_file_read", `{"vm":"lab/vm1","path":"/tmp/link"}`,
			TagDenied, "leads through symlinks to /root/secret, which the policy does not allow", []string{"file", "stat", "--path", "/tmp/link", "--follow-symlinks"}},
		{"followed symlink inside the rules", fmtPolicy(tmpOnly, follow, ""), "vm_file_read", `{"vm":"lab/vm1","path":"/tmp/inside"}`,
			"", "content", []string{"file", "read", "--path", "/tmp/ok", "--offset", "0", "--length", "1048576"}},
		{"plain read", fmtPolicy(tmpOnly, "", ""), "vm_file_read", `{"vm":"lab/vm1","path":"/tmp/ok","max_bytes":5}`,
			"", "conte\n(truncated: the file goes on; read on with offset 5)", []string{"file", "read", "--path", "/tmp/ok", "--offset", "0", "--length", "5"}},
		{"a range with the hash", fmtPolicy(tmpOnly, "", ""), "vm_file_read", `{"vm":"lab/vm1","path":"/tmp/ok","offset":3,"length":100,"hash":true}`,
			"", "(bytes 3..7 of 7)\ntent\nsha256 " + sha256Hex("content"), []string{"file", "read", "--path", "/tmp/ok", "--offset", "3", "--length", "100", "--hash"}},
		{"a range past the policy's cap", fmtPolicy(tmpOnly, `,"files":{"max_read_bytes":2}`, ""), "vm_file_read", `{"vm":"lab/vm1","path":"/tmp/ok","offset":1,"length":100}`,
			"", "(bytes 1..3 of 7)\non", []string{"file", "read", "--path", "/tmp/ok", "--offset", "1", "--length", "2"}},
		{"length and max_bytes", fmtPolicy(tmpOnly, "", ""), "vm_file_read", `{"vm":"lab/vm1","path":"/tmp/ok","length":3,"max_bytes":3}`,
			TagInvalid, "give length or max_bytes, not both", nil},
		{"length 0 without hash", fmtPolicy(tmpOnly, "", ""), "vm_file_read", `{"vm":"lab/vm1","path":"/tmp/ok","length":0}`,
			TagInvalid, "length 0 reads nothing", nil},
		{"negative offset", fmtPolicy(tmpOnly, "", ""), "vm_file_read", `{"vm":"lab/vm1","path":"/tmp/ok","offset":-1}`,
			TagInvalid, "offset", nil},
		{"append", fmtPolicy(tmpOnly, "", ""), "vm_file_write", `{"vm":"lab/vm1","path":"/tmp/x","content":"abc","append":true}`,
			"", "in place", []string{"file", "write", "--path", "/tmp/x", "--size", "3", "--create-mode", "420", "--append"}},
		{"offset with expect_sha256", fmtPolicy(tmpOnly, "", ""), "vm_file_write", `{"vm":"lab/vm1","path":"/tmp/x","content":"abc","offset":2,"expect_sha256":"` + strings.ToUpper(sha256Hex("content")) + `"}`,
			"", "at offset 2", []string{"file", "write", "--path", "/tmp/x", "--size", "3", "--create-mode", "420", "--offset", "2", "--expect-sha256", sha256Hex("content")}},
		{"file changed since read", fmtPolicy(tmpOnly, "", ""), "vm_file_write", `{"vm":"lab/vm1","path":"/tmp/x","content":"abc","append":true,"expect_sha256":"` + sha256Hex("other") + `"}`,
			TagInvalid, "the file changed since it was read", []string{"file", "write", "--path", "/tmp/x", "--size", "3", "--create-mode", "420", "--append", "--expect-sha256", sha256Hex("other")}},
		{"offset and append", fmtPolicy(tmpOnly, "", ""), "vm_file_write", `{"vm":"lab/vm1","path":"/tmp/x","content":"abc","offset":0,"append":true}`,
			TagInvalid, "offset and append do not go together", nil},
		{"expect_sha256 not hex", fmtPolicy(tmpOnly, "", ""), "vm_file_write", `{"vm":"lab/vm1","path":"/tmp/x","content":"abc","expect_sha256":"` + strings.Repeat("g", 64) + `"}`,
			TagInvalid, "want 64 hex digits", nil},
		{"bad base64 before the policy", fmtPolicy(tmpOnly, "", ""), "vm_file_write", `{"vm":"lab/vm1","path":"/root/x","content_base64":"!!"}`,
			TagInvalid, "content_base64 is not valid base64", nil},
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
