package server

import (
	"strings"
	"testing"

	"github.com/vmgate/vmgate/server/mcptest"
)

const keepFilesPolicy = `{"version":"1","default":"allow","tools":{"destroy_session":{"keep_files":"2h"}}}`

// TestRestoreSessionFiles: with keep_files, destroy_session keeps the
// files and says until when; restore_session_files brings them into a new
// session of the same grant, once; another grant, a live session, an
// unknown one or the same session are refused before the guest is asked.
func TestRestoreSessionFiles(t *testing.T) {
	f := newSessFixture(t, haveBins(), keepFilesPolicy)
	old := f.createSession(t, "alice", `{"vm":"lab/vm1"}`)
	fresh := f.createSession(t, "alice", `{"vm":"lab/vm1"}`)
	live := f.createSession(t, "alice", `{"vm":"lab/vm1"}`)
	bobs := f.createSession(t, "bob", `{"vm":"lab/vm1"}`)
	r := f.as(t, "alice", "destroy_session", `{"vm":"lab/vm1","session":"`+old+`"}`)
	if r.Result == nil || r.Result.IsError || r.Result.StructuredContent["files_kept_until"] == nil || !strings.Contains(r.Text(), "restore_session_files") {
		t.Fatalf("destroy_session = %q; want the files kept", r.Text())
	}
	if n := f.guest.count("/usr/local/bin/vmgate-guest", "session", "destroy", "--id", old, "--trash-s", "7200"); n != 1 {
		t.Errorf("destroy with --trash-s 7200 ran %d times; want 1 (commands %q)", n, f.guest.argvs)
	}
	bad := []struct {
		name, grant, args, tag, want string
	}{
		{"other grant", "bob", `{"vm":"lab/vm1","session":"` + bobs + `","from":"` + old + `"}`, TagInvalid, "unknown session"},
		{"from live", "alice", `{"vm":"lab/vm1","session":"` + fresh + `","from":"` + live + `"}`, TagInvalid, "still live"},
		{"same", "alice", `{"vm":"lab/vm1","session":"` + fresh + `","from":"` + fresh + `"}`, TagInvalid, "same session"},
		{"into ended", "alice", `{"vm":"lab/vm1","session":"` + old + `","from":"` + old + `"}`, TagInvalid, "same session"},
		{"from path", "alice", `{"vm":"lab/vm1","session":"` + fresh + `","from":"../../etc"}`, TagInvalid, "unknown session"},
		{"other vm", "alice", `{"vm":"lab/vm2","session":"` + fresh + `","from":"` + old + `"}`, TagInvalid, "unknown session"},
		{"unknown field", "alice", `{"vm":"lab/vm1","session":"` + fresh + `","from":"` + old + `","force":true}`, TagInvalid, "unknown argument"},
	}
	for _, tt := range bad {
		if r := f.as(t, tt.grant, "restore_session_files", tt.args); !mcptest.HasTag(r, tt.tag) || !strings.Contains(r.Text(), tt.want) {
			t.Errorf("%s: restore_session_files = %q; want %s containing %q", tt.name, r.Text(), tt.tag, tt.want)
		}
	}
	if n := f.guest.count("/usr/local/bin/vmgate-guest", "session", "restore"); n != 0 {
		t.Errorf("the guest was asked to restore %d times by refused calls", n)
	}
	r = f.as(t, "alice", "restore_session_files", `{"vm":"lab/vm1","session":"`+fresh+`","from":"`+old+`"}`)
	if r.Result == nil || r.Result.IsError || !strings.Contains(r.Text(), "restored 2 entr(ies) of session "+old) {
		t.Fatalf("restore_session_files = %q; want 2 entries restored", r.Text())
	}
	r = f.as(t, "alice", "restore_session_files", `{"vm":"lab/vm1","session":"`+fresh+`","from":"`+old+`"}`)
	if !mcptest.HasTag(r, TagInvalid) || !strings.Contains(r.Text(), "no files of session "+old+" in the guest's trash") {
		t.Errorf("second restore_session_files = %q; want %s saying the trash has none", r.Text(), TagInvalid)
	}
}

// TestDestroyWithoutKeepFiles: without keep_files the files are removed,
// as before.
func TestDestroyWithoutKeepFiles(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	id := f.createSession(t, "alice", `{"vm":"lab/vm1"}`)
	r := f.as(t, "alice", "destroy_session", `{"vm":"lab/vm1","session":"`+id+`"}`)
	if r.Result == nil || r.Result.IsError || !strings.Contains(r.Text(), "removed its files") {
		t.Errorf("destroy_session = %q; want the files removed", r.Text())
	}
	if n := f.guest.count("/usr/local/bin/vmgate-guest", "session", "destroy", "--id", id); n != 1 {
		t.Errorf("destroy without --trash-s ran %d times; want 1", n)
	}
}
