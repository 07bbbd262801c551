package tools

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/server/catalog"
)

// The session trash: when the policy gives destroy_session keep_files,
// vmgate-guest moves the session's workdir to a trash in the guest for
// that long instead of removing it (guest/agent/trash.go), and
// restore_session_files moves those files into a new session of the same
// grant on the same VM. Only the grant that destroyed a session can
// restore its files: the server checks its record (kept a day after the
// destroy, as long as the longest keep_files) before asking the guest.

func restoreSessionFilesTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "restore_session_files", Title: "Restore a destroyed session's files", Destructive: true,
		Desc: "Move the files of a destroyed session (kept in the guest's trash when the policy sets keep_files on destroy_session) " +
			"into the workdir of a live session of yours on the same VM. Refused when a name exists there already.",
		Fields: []catalog.Field{
			catalog.VMField(true),
			{Name: "session", Kind: catalog.KindString, Desc: "The live session that gets the files (from create_session).", Required: true, MaxLen: 128},
			{Name: "from", Kind: catalog.KindString, Desc: "The destroyed session whose files come back.", Required: true, MaxLen: 128},
		},
		Output: []map[string]any{catalog.OObject(map[string]any{"vm": catalog.OString(), "session": catalog.OString(), "from": catalog.OString(), "workdir": catalog.OString(), "entries": catalog.OArray(catalog.OString())}, "vm", "session", "from", "workdir", "entries")},
	}, runRestoreSessionFiles)
}

// restoreArgs are restore_session_files' arguments.
type restoreArgs struct {
	Session string `arg:"session"`
	From    string `arg:"from"`
}

// trashed is destroy_session's answer when the files went to the trash.
func trashed(out map[string]any, id string, dr guestctl.DestroyResult) catalog.Result {
	until := time.UnixMilli(dr.TrashUntilMS).UTC()
	out["files_kept_until"] = until.Format(time.RFC3339)
	return catalog.Success(out, fmt.Sprintf("destroyed session %s: killed %d process(es); its files are kept in the guest until %s (restore_session_files with from %q brings them into a new session)",
		id, dr.Killed, until.Format(time.RFC3339), id))
}

func runRestoreSessionFiles(e *catalog.Env, c *catalog.Call, a *restoreArgs) catalog.Result {
	g := e.Guest
	h, r := g.HelperFor(c)
	if r != nil {
		return *r
	}
	if a.Session == a.From {
		return catalog.Failure(catalog.TagInvalid, "session and from are the same session", true)
	}
	old, r := g.OwnedSession(c, a.From)
	if r != nil {
		return *r
	}
	if old.Deleted.IsZero() {
		return catalog.Failure(catalog.TagInvalid, fmt.Sprintf("session %s is still live: destroy_session it first (its files are in its workdir)", a.From), true)
	}
	if _, r := g.LiveSession(c, a.Session); r != nil {
		return *r
	}
	rr, err := h.SessionRestore(c.Ctx, c.Name, a.Session, a.From)
	if err != nil {
		r := catalog.HelperFailure(err)
		if errors.Is(err, guestctl.ErrNotFound) {
			r.Text = fmt.Sprintf("no files of session %s in the guest's trash (the policy kept none, or they expired)", a.From)
		}
		return r
	}
	out := map[string]any{"vm": c.VM, "session": a.Session, "from": a.From, "workdir": rr.Workdir, "entries": rr.Entries}
	return catalog.Success(out, fmt.Sprintf("restored %d entr(ies) of session %s into %s: %s", len(rr.Entries), a.From, rr.Workdir, catalog.Truncate(strings.Join(rr.Entries, ", "), 400)))
}
