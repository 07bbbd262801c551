package tools

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"maps"
	"strings"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/server/catalog"
)

// entryPolicy asks a call's grant's policy about the paths under the
// call's directory (Env.Policy, the gate's extension point, as Redecide
// does for a path a symlink led to), each as the call's args.path.
//
// An entry is allowed when the policy allows it (or decides in shadow
// mode), or sends it for approval under the very rule that sent the call
// itself, which was approved: the approval was for this archive. A
// refusal under any other rule refuses the entry.
type entryPolicy struct {
	e    *catalog.Env
	c    *catalog.Call
	args map[string]any
}

func newEntryPolicy(e *catalog.Env, c *catalog.Call) *entryPolicy {
	return &entryPolicy{e: e, c: c, args: maps.Clone(c.ArgMap)}
}

// allows reports whether the policy lets the call touch p, and if not why.
func (ep *entryPolicy) allows(p string) (bool, string) {
	ep.args["path"] = p
	d, ok := ep.e.Policy.Decide(ep.c, ep.args)
	switch {
	case !ok:
		return false, "this grant has no policy"
	case d.Shadow || d.Verdict == policy.Allow:
		return true, ""
	case d.Verdict == policy.Approve && ep.c.Rules.Verdict == policy.Approve && d.Rule == ep.c.Rules.Rule:
		return true, ""
	case d.Verdict == policy.Approve:
		return false, "it needs an approval of its own (" + d.Rule + ")"
	case d.Reason != "":
		return false, d.Reason
	}
	return false, "the policy does not allow it"
}

// refusedEntry is an archive entry the policy refused.
type refusedEntry struct {
	Index     int
	Path, Why string
}

// refusals are the indexes of entries whose path the policy refuses, and
// the entries. An entry without a path (its name leaves the target) is
// the guest's to refuse.
func (ep *entryPolicy) refusals(entries []guestctl.ArchiveEntry) ([]int, []refusedEntry) {
	var idx []int
	var out []refusedEntry
	for _, en := range entries {
		if en.Path == "" {
			continue
		}
		if ok, why := ep.allows(en.Path); !ok {
			idx = append(idx, en.Index)
			out = append(out, refusedEntry{Index: en.Index, Path: en.Path, Why: why})
		}
	}
	return idx, out
}

// refuseEntries is the refusal of a call whose policy refuses the whole
// call for a refused entry (files.denied_entries "refuse").
func refuseEntries(tool string, refused []refusedEntry) catalog.Result {
	var b strings.Builder
	for i, r := range refused {
		if i == 5 {
			fmt.Fprintf(&b, "; and %d more", len(refused)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "entry %d %s: %s", r.Index, r.Path, r.Why)
	}
	r := catalog.Failure(catalog.TagDenied, fmt.Sprintf("%d entries of the archive go to paths the policy does not allow (%s), and the policy refuses the whole %s then (files.denied_entries \"refuse\"): leave them out of the archive, or choose another directory", len(refused), b.String(), tool), true)
	r.Detail = fmt.Sprintf("%s: %d entries refused by the policy: %+v", tool, len(refused), refused)
	return r
}

// filterRead is the tar an archive read returned, less the entries whose
// paths the policy refuses, and those paths: decided on the tar's own
// entries (as guestctl.ArchiveList joins them to dir), so that what the
// agent gets is what the policy saw. With refuse, one refused entry
// refuses the call. A tar with nothing to cut comes back as it was.
func filterRead(ep *entryPolicy, tarball []byte, dir string, lim guestctl.ArchiveLimits, refuse bool) ([]byte, []string, *catalog.Result) {
	entries, err := guestctl.ArchiveList(tarball, dir, lim)
	if err != nil {
		r := fileFailure(err)
		return nil, nil, &r
	}
	skip, refused := ep.refusals(entries)
	for _, en := range entries {
		if en.Path == "" { // the guest wrote a name that leaves dir: never handed out
			skip = append(skip, en.Index)
			refused = append(refused, refusedEntry{Index: en.Index, Path: en.Name, Why: "the name leaves the directory"})
		}
	}
	if len(skip) == 0 {
		return tarball, nil, nil
	}
	if refuse {
		r := refuseEntries("vm_archive_read", refused)
		return nil, nil, &r
	}
	out, err := dropEntries(tarball, skip, lim)
	if err != nil {
		r := catalog.Failure(catalog.TagBackend, "the archive could not be rewritten without the entries the policy refuses: "+err.Error(), true)
		return nil, nil, &r
	}
	paths := make([]string, len(refused))
	for i, r := range refused {
		paths[i] = r.Path
	}
	return out, paths, nil
}

// dropEntries rewrites the tar (gzip'd or not, and kept so) without the
// entries at the indexes of skip.
func dropEntries(tarball []byte, skip []int, lim guestctl.ArchiveLimits) ([]byte, error) {
	drop := make(map[int]bool, len(skip))
	for _, i := range skip {
		drop[i] = true
	}
	var buf bytes.Buffer
	var zw *gzip.Writer
	var w io.Writer = &buf
	if len(tarball) > 1 && tarball[0] == 0x1f && tarball[1] == 0x8b {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	_, err := wire.ScanArchive(bytes.NewReader(tarball), lim, func(h wire.ArchiveHeader, body io.Reader) error {
		if drop[h.Index] {
			return nil
		}
		if err := tw.WriteHeader(h.Header); err != nil {
			return err
		}
		_, err := io.Copy(tw, body)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}
