package server

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/vmgate/vmgate/internal/guestctl"
)

// The session trash: when the policy gives destroy_session keep_files,
// vmgate-guest moves the session's workdir to a trash in the guest for
// that long instead of removing it (guest/agent/trash.go), and
// restore_session_files moves those files into a new session of the same
// grant on the same VM. Only the grant that destroyed a session can
// restore its files: the server checks its record (kept a day after the
// destroy, as long as the longest keep_files) before asking the guest.

func restoreSessionFilesTool() *toolSpec {
	return newTool(toolSpec{
		name: "restore_session_files", title: "Restore a destroyed session's files", destructive: true,
		desc: "Move the files of a destroyed session (kept in the guest's trash when the policy sets keep_files on destroy_session) " +
			"into the workdir of a live session of yours on the same VM. Refused when a name exists there already.",
		fields: []field{
			vmField(true),
			{name: "session", kind: kindString, desc: "The live session that gets the files (from create_session).", required: true, maxLen: 128},
			{name: "from", kind: kindString, desc: "The destroyed session whose files come back.", required: true, maxLen: 128},
		},
		output: []map[string]any{oObject(map[string]any{"vm": oString, "session": oString, "from": oString, "workdir": oString, "entries": oArray(oString)}, "vm", "session", "from", "workdir", "entries")},
	}, (*Server).runRestoreSessionFiles)
}

// restoreArgs are restore_session_files' arguments.
type restoreArgs struct {
	Session string `arg:"session"`
	From    string `arg:"from"`
}

// trashed is destroy_session's answer when the files went to the trash.
func trashed(out map[string]any, id string, dr guestctl.DestroyResult) result {
	until := time.UnixMilli(dr.TrashUntilMS).UTC()
	out["files_kept_until"] = until.Format(time.RFC3339)
	return success(out, fmt.Sprintf("destroyed session %s: killed %d process(es); its files are kept in the guest until %s (restore_session_files with from %q brings them into a new session)",
		id, dr.Killed, until.Format(time.RFC3339), id))
}

func (s *Server) runRestoreSessionFiles(c *call, a *restoreArgs) result {
	g := s.guest
	h, r := g.helperFor(c)
	if r != nil {
		return *r
	}
	if a.Session == a.From {
		return failure(TagInvalid, "session and from are the same session", true)
	}
	old, r := g.ownedSession(c, a.From)
	if r != nil {
		return *r
	}
	if old.Deleted.IsZero() {
		return failure(TagInvalid, fmt.Sprintf("session %s is still live: destroy_session it first (its files are in its workdir)", a.From), true)
	}
	if _, r := g.liveSession(c, a.Session); r != nil {
		return *r
	}
	rr, err := h.SessionRestore(c.ctx, c.name, a.Session, a.From)
	if err != nil {
		r := helperFailure(err)
		if errors.Is(err, guestctl.ErrNotFound) {
			r.text = fmt.Sprintf("no files of session %s in the guest's trash (the policy kept none, or they expired)", a.From)
		}
		return r
	}
	out := map[string]any{"vm": c.vm, "session": a.Session, "from": a.From, "workdir": rr.Workdir, "entries": rr.Entries}
	return success(out, fmt.Sprintf("restored %d entr(ies) of session %s into %s: %s", len(rr.Entries), a.From, rr.Workdir, truncate(strings.Join(rr.Entries, ", "), 400)))
}
