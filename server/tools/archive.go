package tools

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/server/catalog"
)

// Directories: vm_dir_list, vm_archive_read and vm_archive_write, through
// vmgate-guest with the rules of the single-file tools (no symlink
// followed, no path leaving the target; guest/agent/archive_*.go). The
// policy's path rules see every entry: each entry's path is asked of the
// grant's policy again as args.path (entries.go) — before the guest is
// touched for a write (from guestctl.ArchiveList; refused entries are
// skipped by index, or the call is refused, as files.denied_entries
// says), and on the tar the guest returned for a read, before the agent
// gets it (refused entries are cut out of it).

const pathDesc = "Absolute, clean path of a directory in the guest (no \".\", \"..\", \"//\" or trailing \"/\")."

func dirListTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "vm_dir_list", Title: "List a directory", ReadOnly: true, Idempotent: true,
		Desc: "List a directory in a VM down to depth levels: each entry's path (relative to the directory), type, size, mode, mtime, owner, and a symlink's target (never followed). Entries the policy's path rules do not allow are left out and counted in hidden.",
		Fields: []catalog.Field{
			catalog.VMField(true),
			{Name: "path", Kind: catalog.KindString, Desc: pathDesc, Required: true, MaxLen: 4096, GuestPath: true},
			{Name: "depth", Kind: catalog.KindInteger, Desc: "Levels to list (1: the directory's own entries).", Min: 1, Max: wire.MaxDirDepth, Default: int64(1)},
			{Name: "max_entries", Kind: catalog.KindInteger, Desc: fmt.Sprintf("List at most this many entries (default %d; the policy's files.max_entries caps it).", wire.DefaultDirEntries), Min: 1, Max: wire.MaxDirEntries},
		},
		Output: []map[string]any{catalog.OObject(map[string]any{
			"path": catalog.OString(), "depth": catalog.ONonNeg(), "truncated": catalog.OBoolean(), "hidden": catalog.ONonNeg(),
			"entries": catalog.OArray(catalog.OOpen(map[string]any{
				"path": catalog.OString(), "type": catalog.OString(), "size": catalog.ONonNeg(), "mode": catalog.OString(),
				"mtime_ms": catalog.OInteger(), "uid": catalog.ONonNeg(), "gid": catalog.ONonNeg(), "target": catalog.OString(), "error": catalog.OString(),
			}, "path", "type")),
		}, "path", "entries", "truncated", "hidden")},
	}, runDirList)
}

// dirListArgs are vm_dir_list's arguments.
type dirListArgs struct {
	Path       string `arg:"path"`
	Depth      int64  `arg:"depth"`
	MaxEntries int64  `arg:"max_entries"`
}

func runDirList(e *catalog.Env, c *catalog.Call, a *dirListArgs) catalog.Result {
	h, p, r := helperAt(e, c, a.Path, false)
	if r != nil {
		return *r
	}
	most := int64(min(c.FileRules().MaxEntries, wire.MaxDirEntries))
	n := min(most, int64(wire.DefaultDirEntries))
	if a.MaxEntries > 0 {
		n = min(a.MaxEntries, most)
	}
	dl, err := h.DirList(c.Ctx, c.Name, p, guestctl.DirOptions{Depth: int(max(a.Depth, 1)), MaxEntries: int(n)})
	if err != nil {
		return fileFailure(err)
	}
	ask := newEntryPolicy(e, c)
	entries := make([]map[string]any, 0, len(dl.Entries))
	var text strings.Builder
	hidden := 0
	for _, d := range dl.Entries {
		if ok, _ := ask.allows(joinPath(dl.Path, d.Path)); !ok {
			hidden++
			continue
		}
		m := map[string]any{"path": d.Path, "type": d.Type, "size": d.Size, "mode": fmt.Sprintf("%04o", d.Mode), "mtime_ms": d.MtimeMS, "uid": d.UID, "gid": d.GID}
		if d.Target != "" {
			m["target"] = d.Target
		}
		if d.Error != "" {
			m["error"] = d.Error
		}
		entries = append(entries, m)
		fmt.Fprintf(&text, "%s %04o %10d %s", d.Type, d.Mode, d.Size, d.Path)
		if d.Target != "" {
			fmt.Fprintf(&text, " -> %s", d.Target)
		}
		text.WriteByte('\n')
	}
	if dl.Truncated {
		fmt.Fprintf(&text, "(truncated at %d entries: list a subdirectory, or less deep)\n", n)
	}
	if hidden > 0 {
		fmt.Fprintf(&text, "(%d entries left out: the policy does not allow their paths)\n", hidden)
	}
	return catalog.Success(map[string]any{"path": dl.Path, "depth": dl.Depth, "entries": entries, "truncated": dl.Truncated, "hidden": hidden}, text.String())
}

// joinPath is dir/rel for a listing's relative path.
func joinPath(dir, rel string) string {
	if dir == "/" {
		return "/" + rel
	}
	return dir + "/" + rel
}

func archiveReadTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "vm_archive_read", Title: "Read a directory as a tar", ReadOnly: true, Idempotent: true,
		Desc: "Archive a directory of a VM as a tar (gzip optional), returned as content_base64 with its sha256: regular files, directories, and symlinks as symlinks (never followed); devices, FIFOs and sockets are skipped and listed. Entries the policy's path rules do not allow are cut out (policy_skipped) or refuse the call, as the policy says. Sizes and entries are capped by the policy (files.max_archive_bytes, files.max_entries).",
		Fields: []catalog.Field{
			catalog.VMField(true),
			{Name: "path", Kind: catalog.KindString, Desc: pathDesc, Required: true, MaxLen: 4096, GuestPath: true},
			{Name: "gzip", Kind: catalog.KindBoolean, Desc: "Compress the tar with gzip."},
		},
		Output: []map[string]any{catalog.OObject(map[string]any{
			"path": catalog.OString(), "entries": catalog.ONonNeg(), "bytes": catalog.ONonNeg(), "gzip": catalog.OBoolean(),
			"content_base64": catalog.OString(), "sha256": catalog.OString(), "size": catalog.ONonNeg(),
			"skipped":      catalog.OArray(catalog.OOpen(map[string]any{"path": catalog.OString(), "type": catalog.OString(), "reason": catalog.OString()})),
			"skipped_more": catalog.ONonNeg(), "changed": catalog.OArray(catalog.OString()),
			"policy_skipped": catalog.OArray(catalog.OString()),
		}, "path", "entries", "bytes", "gzip", "content_base64", "sha256", "size")},
	}, runArchiveRead)
}

// archiveReadArgs are vm_archive_read's arguments.
type archiveReadArgs struct {
	Path string `arg:"path"`
	Gzip bool   `arg:"gzip"`
}

func runArchiveRead(e *catalog.Env, c *catalog.Call, a *archiveReadArgs) catalog.Result {
	h, p, r := helperAt(e, c, a.Path, false)
	if r != nil {
		return *r
	}
	rules := c.FileRules()
	lim := guestctl.ArchiveLimits{MaxBytes: rules.MaxArchiveBytes, MaxEntries: rules.MaxEntries}
	// One result carries the tar (budget.go): its files' content is bounded
	// by that too, unless gzip may shrink them.
	maxTar := e.Limits.RawBudget()
	capped := !a.Gzip && maxTar < lim.MaxBytes
	if capped {
		lim.MaxBytes = maxTar
	}
	c.Progress.Report("archiving " + p)
	ar, tarball, err := h.ArchiveRead(c.Ctx, c.Name, p, guestctl.ArchiveReadOptions{Gzip: a.Gzip, Limits: lim, Progress: bytesMoved(c)})
	if err != nil {
		if capped && guestctl.IsLimit(err, "content past") {
			return e.Limits.TarTooLarge(p, a.Gzip, err)
		}
		return fileFailure(err)
	}
	tarball, cut, r := filterRead(newEntryPolicy(e, c), tarball, ar.Path, lim, rules.RefuseDeniedEntries)
	if r != nil {
		return *r
	}
	if int64(len(tarball)) > maxTar {
		return e.Limits.TarTooLarge(p, a.Gzip, fmt.Errorf("archive read: a tar of %d bytes", len(tarball)))
	}
	sum := sha256.Sum256(tarball)
	out := map[string]any{"path": ar.Path, "entries": ar.Entries - len(cut), "bytes": ar.Bytes, "gzip": ar.Gzip,
		"content_base64": base64.StdEncoding.EncodeToString(tarball), "sha256": hex.EncodeToString(sum[:]), "size": len(tarball)}
	text := fmt.Sprintf("archived %s: %d entries, %d bytes of files, a %d-byte tar (sha256 %x) in content_base64", ar.Path, ar.Entries-len(cut), ar.Bytes, len(tarball), sum)
	if len(ar.Skipped) > 0 {
		sk := make([]map[string]any, len(ar.Skipped))
		for i, s := range ar.Skipped {
			sk[i] = map[string]any{"path": s.Path, "type": s.Type, "reason": s.Reason}
		}
		out["skipped"], out["skipped_more"] = sk, ar.SkippedMore
		text += fmt.Sprintf("\nskipped %d entries (devices, FIFOs, sockets, unreadable): see skipped", len(ar.Skipped)+ar.SkippedMore)
	}
	if len(ar.Changed) > 0 {
		out["changed"] = ar.Changed
		text += fmt.Sprintf("\n%d files changed while they were read (see changed): read them again", len(ar.Changed))
	}
	if len(cut) > 0 {
		out["policy_skipped"] = cut
		text += fmt.Sprintf("\n%d entries cut out: the policy does not allow their paths (see policy_skipped)", len(cut))
	}
	return catalog.Success(out, text)
}

func archiveWriteTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "vm_archive_write", Title: "Write a tar into a directory", Destructive: true,
		Desc: "Extract a tar (gzip'd or not, as content_base64) into a directory of a VM. Entry by entry: no symlink is followed and no path leaves the directory (\"..\", absolute names, hard links out and files through a symlink are refused); a symlink pointing out, setuid/setgid bits and devices are refused unless the policy allows them; regular files are written atomically. Every entry's path is asked of the policy: a refused entry is skipped (or refuses the whole call, as the policy says). all_or_nothing writes nothing if any entry is refused; dry_run says what each entry would do.",
		Fields: []catalog.Field{
			catalog.VMField(true),
			{Name: "path", Kind: catalog.KindString, Desc: pathDesc, Required: true, MaxLen: 4096, GuestPath: true},
			{Name: "content_base64", Kind: catalog.KindString, Desc: "The tar (or tar.gz), base64 encoded.", Required: true},
			{Name: "create", Kind: catalog.KindBoolean, Desc: "Create the directory if it is missing (its parent must exist)."},
			{Name: "all_or_nothing", Kind: catalog.KindBoolean, Desc: "If any entry is refused, write nothing (aborted)."},
			{Name: "dry_run", Kind: catalog.KindBoolean, Desc: "Write nothing: say what each entry would do."},
		},
		Output: []map[string]any{catalog.OObject(map[string]any{
			"path": catalog.OString(), "written": catalog.ONonNeg(), "refused": catalog.ONonNeg(), "bytes": catalog.ONonNeg(),
			"dry_run": catalog.OBoolean(), "aborted": catalog.OBoolean(), "policy_refused": catalog.ONonNeg(),
			"refused_entries": catalog.OArray(catalog.OOpen(map[string]any{
				"index": catalog.ONonNeg(), "name": catalog.OString(), "path": catalog.OString(), "reason": catalog.OString(), "message": catalog.OString(),
			}, "index", "name", "reason")),
		}, "path", "written", "refused", "bytes", "policy_refused")},
	}, runArchiveWrite)
}

// archiveWriteArgs are vm_archive_write's arguments.
type archiveWriteArgs struct {
	Path          string `arg:"path"`
	ContentBase64 string `arg:"content_base64"`
	Create        bool   `arg:"create"`
	AllOrNothing  bool   `arg:"all_or_nothing"`
	DryRun        bool   `arg:"dry_run"`
}

// CheckArgs refuses, before the policy, content that is not base64 or
// not a tar the guest could read (within the largest limits; the
// policy's own are the handler's).
func (a *archiveWriteArgs) CheckArgs() error {
	data, err := base64.StdEncoding.DecodeString(a.ContentBase64)
	if err != nil {
		return errors.New("content_base64 is not valid base64")
	}
	if _, err := guestctl.ArchiveList(data, a.Path, guestctl.ArchiveLimits{MaxBytes: wire.MaxArchiveBytes, MaxEntries: wire.MaxArchiveEntries}); err != nil {
		return fmt.Errorf("content_base64: %s", catalog.CleanReason(strings.TrimPrefix(err.Error(), "archive write: ")))
	}
	return nil
}

func runArchiveWrite(e *catalog.Env, c *catalog.Call, a *archiveWriteArgs) catalog.Result {
	data, err := base64.StdEncoding.DecodeString(a.ContentBase64)
	if err != nil {
		return catalog.Failure(catalog.TagInvalid, "content_base64 is not valid base64", true)
	}
	rules := c.FileRules()
	lim := guestctl.ArchiveLimits{MaxBytes: rules.MaxArchiveBytes, MaxEntries: rules.MaxEntries}
	entries, err := guestctl.ArchiveList(data, a.Path, lim)
	if err != nil {
		return fileFailure(err)
	}
	skip, refused := newEntryPolicy(e, c).refusals(entries)
	if len(skip) > 0 && rules.RefuseDeniedEntries {
		return refuseEntries("vm_archive_write", refused)
	}
	h, r := e.Guest.HelperFor(c)
	if r != nil {
		return *r
	}
	c.Progress.Report(fmt.Sprintf("writing %d entries (%d bytes) into %s", len(entries), len(data), a.Path))
	aw, err := h.ArchiveWrite(c.Ctx, c.Name, a.Path, data, guestctl.ArchiveWriteOptions{
		Limits: lim, SpecialBits: rules.SpecialBits, Devices: rules.Devices, SymlinksOut: rules.SymlinksOut,
		AllOrNothing: a.AllOrNothing, DryRun: a.DryRun, Create: a.Create, Skip: skip, Progress: bytesMoved(c),
	})
	if err != nil {
		return fileFailure(err)
	}
	return archiveWritten(aw, len(skip))
}

// maxListed bounds the refused entries a result lists.
const maxListed = 100

// archiveWritten is the result of an archive write.
func archiveWritten(aw guestctl.ArchiveWritten, policyRefused int) catalog.Result {
	var refused []map[string]any
	for _, en := range aw.Entries {
		if en.Action == wire.ActionRefused && len(refused) < maxListed {
			refused = append(refused, map[string]any{"index": en.Index, "name": en.Name, "path": en.Path, "reason": en.Reason, "message": en.Message})
		}
	}
	out := map[string]any{"path": aw.Path, "written": aw.Written, "refused": aw.Refused, "bytes": aw.Bytes, "dry_run": aw.DryRun, "aborted": aw.Aborted, "policy_refused": policyRefused}
	if refused != nil {
		out["refused_entries"] = refused
	}
	verb := "wrote"
	switch {
	case aw.DryRun:
		verb = "would write"
	case aw.Aborted:
		verb = "aborted (all_or_nothing), wrote nothing of"
	}
	text := fmt.Sprintf("%s %d entries (%d bytes of files) into %s; %d refused", verb, aw.Written, aw.Bytes, aw.Path, aw.Refused)
	for _, en := range refused {
		text += fmt.Sprintf("\nrefused #%d %q: %s", en["index"], en["name"], en["message"])
	}
	return catalog.Success(out, text)
}
