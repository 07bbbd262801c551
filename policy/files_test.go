package policy

import (
	"strings"
	"testing"
)

func TestFileRules(t *testing.T) {
	doc := func(tool, files string) string {
		return `{"version":"1","default":"allow","tools":{"` + tool + `":{"files":` + files + `}}}`
	}
	def := func(f func(*FileRules)) *FileRules {
		r := DefaultFileRules()
		f(&r)
		return &r
	}
	cases := []struct {
		name, doc, tool string
		want            *FileRules
	}{
		{"unlisted read: defaults", `{"version":"1","default":"allow"}`, "vm_file_read", def(func(*FileRules) {})},
		{"listed without a block: defaults", `{"version":"1","default":"deny","tools":{"vm_file_write":{}}}`, "vm_file_write", def(func(*FileRules) {})},
		{"not a file tool", `{"version":"1","default":"allow"}`, "list_vms", nil},
		{"exec without a block: nil, the defaults", `{"version":"1","default":"allow"}`, "vm_agent_exec", nil},
		{"exec: follow", doc("vm_agent_exec", `{"follow_symlinks":true}`), "vm_agent_exec", def(func(r *FileRules) { r.FollowSymlinks = true })},
		{"follow", doc("vm_file_read", `{"follow_symlinks":true}`), "vm_file_read", def(func(r *FileRules) { r.FollowSymlinks = true })},
		{"mode", doc("vm_file_write", `{"default_mode":"0600"}`), "vm_file_write", def(func(r *FileRules) { r.DefaultMode = 0o600 })},
		{"three digits", doc("vm_file_write", `{"default_mode":"750"}`), "vm_file_write", def(func(r *FileRules) { r.DefaultMode = 0o750 })},
		{"special", doc("vm_file_write", `{"special_bits":true,"default_mode":"1777"}`), "vm_file_write", def(func(r *FileRules) { r.SpecialBits, r.DefaultMode = true, 0o1777 })},
		{"archive caps", doc("vm_archive_write", `{"max_archive_bytes":1024,"max_entries":5,"devices":true,"symlinks_out":true,"denied_entries":"refuse"}`), "vm_archive_write",
			def(func(r *FileRules) {
				r.MaxArchiveBytes, r.MaxEntries, r.Devices, r.SymlinksOut, r.RefuseDeniedEntries = 1024, 5, true, true, true
			})},
		{"read cap", doc("vm_file_read", `{"max_read_bytes":4096}`), "vm_file_read", def(func(r *FileRules) { r.MaxReadBytes = 4096 })},
		{"dir list", doc("vm_dir_list", `{"max_entries":7}`), "vm_dir_list", def(func(r *FileRules) { r.MaxEntries = 7 })},
	}
	for _, tc := range cases {
		d := mustParse(t, tc.doc).Decide(Call{Grant: "g", Tool: tc.tool, VM: "lab/vm1", Args: map[string]any{"path": "/tmp/x"}})
		if d.Verdict != Allow {
			t.Errorf("%s: Decide = %v (%s); want allow", tc.name, d.Verdict, d.Reason)
		}
		switch {
		case tc.want == nil && d.Files != nil:
			t.Errorf("%s: Files = %+v; want nil", tc.name, *d.Files)
		case tc.want != nil && (d.Files == nil || *d.Files != *tc.want):
			t.Errorf("%s: Files = %+v; want %+v", tc.name, d.Files, *tc.want)
		}
	}
	// An approval carries the rules too: the handler needs them after the approval.
	d := mustParse(t, `{"version":"1","default":"deny","tools":{"vm_file_write":{"action":"approve","files":{"default_mode":"0640"}}}}`).
		Decide(Call{Grant: "g", Tool: "vm_file_write", Args: map[string]any{}})
	if d.Verdict != Approve || d.Files == nil || d.Files.DefaultMode != 0o640 {
		t.Errorf("approve: Decide = %v, Files %+v; want approve with mode 0640", d.Verdict, d.Files)
	}
}

func TestParseFileRulesErrors(t *testing.T) {
	doc := func(tool, files string) string {
		return `{"version":"1","default":"allow","tools":{"` + tool + `":{"files":` + files + `}}}`
	}
	cases := []struct{ name, doc, want string }{
		{"on another tool", doc("kill_process", `{}`), `tools.kill_process.files: a files block belongs on [vm_file_read vm_file_write vm_agent_exec vm_dir_list vm_archive_read vm_archive_write], not on kill_process`},
		{"a mode on exec", doc("vm_agent_exec", `{"default_mode":"0600"}`), `tools.vm_agent_exec.files.default_mode: unknown field "default_mode"`},
		{"unknown field", doc("vm_file_read", `{"follow":true}`), `tools.vm_file_read.files.follow: unknown field "follow"`},
		{"follow not a bool", doc("vm_file_read", `{"follow_symlinks":"yes"}`), `tools.vm_file_read.files.follow_symlinks: want true or false, got string`},
		{"mode a number", doc("vm_file_write", `{"default_mode":420}`), `tools.vm_file_write.files.default_mode: want a string, got number`},
		{"mode not octal", doc("vm_file_write", `{"default_mode":"0648"}`), `want three or four octal digits`},
		{"mode too long", doc("vm_file_write", `{"default_mode":"00644"}`), `want three or four octal digits`},
		{"setuid default without special_bits", doc("vm_file_write", `{"default_mode":"4755"}`), `default mode 4755 has setuid, setgid or sticky bits and special_bits is not true`},
		{"read cap over", doc("vm_file_read", `{"max_read_bytes":268435457}`), `tools.vm_file_read.files.max_read_bytes: 268435457 out of range 1..268435456`},
		{"entries zero", doc("vm_archive_read", `{"max_entries":0}`), `tools.vm_archive_read.files.max_entries: 0 out of range 1..1000000`},
		{"archive bytes a string", doc("vm_archive_write", `{"max_archive_bytes":"1"}`), `tools.vm_archive_write.files.max_archive_bytes: want an integer, got string`},
		{"denied entries", doc("vm_archive_write", `{"denied_entries":"ignore"}`), `tools.vm_archive_write.files.denied_entries: want "skip" or "refuse", got "ignore"`},
		{"exec takes no caps", doc("vm_agent_exec", `{"max_entries":5}`), `unknown field "max_entries"`},
		{"not an object", doc("vm_file_write", `true`), `tools.vm_file_write.files: want an object, got bool`},
	}
	for _, tc := range cases {
		_, err := Parse("p.json", []byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Parse = %v; want an error containing %q", tc.name, err, tc.want)
		}
	}
}
