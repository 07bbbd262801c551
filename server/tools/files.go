package tools

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/server/catalog"
)

// Files: vm_file_read and vm_file_write, through vmgate-guest, so that a
// path means the file it names: the guest opens it following no symlink
// (guest/agent/files.go). When the tool's policy allows following symlinks
// (files.follow_symlinks), the guest resolves the path first and the policy
// decides again on the real path, which is then opened without following
// anything (a link swapped in between is refused). A guest without
// vmgate-guest gets it pushed (internal/guestctl); a host without builds of
// it refuses the file tools rather than fall back to the driver's file
// channel, which follows symlinks.

func fileReadTool(l catalog.Limits) *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "vm_file_read", Title: "Read a file", ReadOnly: true, Idempotent: true,
		Desc: "Read a regular file in a VM. Text comes back as content, anything else as content_base64; truncated says whether the file was longer than max_bytes. A symlink anywhere in the path is refused unless the policy allows following symlinks; then path is the real path read.",
		Fields: []catalog.Field{
			catalog.VMField(true),
			{Name: "path", Kind: catalog.KindString, Desc: "Absolute, clean path in the guest (no \".\", \"..\", \"//\" or trailing \"/\").", Required: true, MaxLen: 4096, GuestPath: true},
			{Name: "max_bytes", Kind: catalog.KindInteger, Desc: fmt.Sprintf("Read at most this many bytes; the server caps it at %d.", l.MaxOutputBytes), Min: 1, Max: math.MaxInt64},
		},
		Output: []map[string]any{catalog.OObject(map[string]any{
			"path": catalog.OString(), "requested_path": catalog.OString(), "bytes": catalog.ONonNeg(), "truncated": catalog.OBoolean(),
			"mode": catalog.ONonNeg(), "mode_octal": catalog.OString(), "size": catalog.ONonNeg(), "content": catalog.OString(), "content_base64": catalog.OString(),
		}, "path", "bytes", "truncated")},
	}, runFileRead)
}

func fileWriteTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "vm_file_write", Title: "Write a file", Destructive: true, Idempotent: true,
		Desc: "Create or replace a regular file in a VM. Give exactly one of content (text) or content_base64 (bytes). The last path component is never followed if it is a symlink, nor any other symlink unless the policy allows it; a new file gets mode 0644 (or the policy's default) unless mode is given; setuid, setgid and sticky bits need the policy's leave.",
		Fields: []catalog.Field{
			catalog.VMField(true),
			{Name: "path", Kind: catalog.KindString, Desc: "Absolute, clean path in the guest (no \".\", \"..\", \"//\" or trailing \"/\").", Required: true, MaxLen: 4096, GuestPath: true},
			{Name: "content", Kind: catalog.KindString, Desc: "The new content as text.", AllowNUL: true},
			{Name: "content_base64", Kind: catalog.KindString, Desc: "The new content, base64 encoded."},
			{Name: "mode", Kind: catalog.KindInteger, Desc: "Permission bits as a number (420 = 0644), as the result's mode reports them (mode_octal spells them \"0644\"). Default: an existing file keeps its mode, a new one gets 0644 or the policy's default.", Min: 0, Max: 0o7777},
		},
		ExactlyOne: [][]string{{"content", "content_base64"}},
		Output: []map[string]any{catalog.OObject(map[string]any{
			"path": catalog.OString(), "requested_path": catalog.OString(), "bytes_written": catalog.ONonNeg(), "mode": catalog.ONonNeg(), "mode_octal": catalog.OString(), "created": catalog.OBoolean(),
		}, "path", "bytes_written")},
	}, runFileWrite)
}

// fileReadArgs are vm_file_read's arguments.
type fileReadArgs struct {
	Path     string `arg:"path"`
	MaxBytes int64  `arg:"max_bytes"` // 0: the server's cap
}

func runFileRead(e *catalog.Env, c *catalog.Call, a *fileReadArgs) catalog.Result {
	if err := guestctl.CheckPath("vm_file_read", a.Path); err != nil {
		return catalog.Failure(catalog.TagInvalid, "path "+catalog.PathProblem(err), true)
	}
	h, r := e.Guest.HelperFor(c)
	if r != nil {
		return *r
	}
	p, r := resolveFile(e, c, h, a.Path, false)
	if r != nil {
		return *r
	}
	fr, err := h.FileRead(c.Ctx, c.Name, p, min(e.OutputCap(a.MaxBytes), wire.MaxFileReadBytes))
	if err != nil {
		return fileFailure(err)
	}
	out := map[string]any{"path": fr.Path, "bytes": len(fr.Data), "truncated": fr.Truncated, "mode": fr.Mode, "mode_octal": octalMode(fr.Mode), "size": fr.Size}
	if fr.Path != a.Path {
		out["requested_path"] = a.Path
	}
	if isText(fr.Data) {
		out["content"] = string(fr.Data)
	} else {
		out["content_base64"] = base64.StdEncoding.EncodeToString(fr.Data)
	}
	text := string(fr.Data)
	if !isText(fr.Data) {
		text = fmt.Sprintf("(%d bytes of binary data, see content_base64)", len(fr.Data))
	}
	if fr.Truncated {
		text += "\n(truncated)"
	}
	return catalog.Success(out, text)
}

// fileWriteArgs are vm_file_write's arguments. Exactly one of Content and
// ContentBase64 is set (the catalogue says so).
type fileWriteArgs struct {
	Path          string  `arg:"path"`
	Content       *string `arg:"content"`
	ContentBase64 *string `arg:"content_base64"`
	Mode          *int64  `arg:"mode"` // nil: keep an existing file's, the policy's default for a new one
}

// data is the content to write.
func (a *fileWriteArgs) data() ([]byte, error) {
	if a.Content != nil {
		return []byte(*a.Content), nil
	}
	return base64.StdEncoding.DecodeString(*a.ContentBase64)
}

func runFileWrite(e *catalog.Env, c *catalog.Call, a *fileWriteArgs) catalog.Result {
	if err := guestctl.CheckPath("vm_file_write", a.Path); err != nil {
		return catalog.Failure(catalog.TagInvalid, "path "+catalog.PathProblem(err), true)
	}
	data, err := a.data()
	if err != nil {
		return catalog.Failure(catalog.TagInvalid, "content_base64 is not valid base64", true)
	}
	rules := c.FileRules()
	o := guestctl.WriteOptions{CreateMode: rules.DefaultMode, SpecialBits: rules.SpecialBits}
	if a.Mode != nil {
		m := uint32(*a.Mode)
		if m&policy.SpecialModeBits != 0 && !rules.SpecialBits {
			return catalog.Failure(catalog.TagDenied, fmt.Sprintf("mode %#o sets setuid, setgid or sticky bits, which the policy does not allow (files.special_bits); give a mode without them, such as %#o", m, m&0o777), true)
		}
		o.Mode = &m
	}
	h, r := e.Guest.HelperFor(c)
	if r != nil {
		return *r
	}
	p, r := resolveFile(e, c, h, a.Path, true)
	if r != nil {
		return *r
	}
	fw, err := h.FileWrite(c.Ctx, c.Name, p, data, o)
	if err != nil {
		return fileFailure(err)
	}
	out := map[string]any{"path": fw.Path, "bytes_written": fw.Bytes, "mode": fw.Mode, "mode_octal": octalMode(fw.Mode), "created": fw.Created}
	if fw.Path != a.Path {
		out["requested_path"] = a.Path
	}
	return catalog.Success(out, fmt.Sprintf("wrote %d bytes to %s (mode %04o)", fw.Bytes, fw.Path, fw.Mode))
}

// octalMode is a file mode as people write it ("0644"); a result's mode is
// the number vm_file_write's mode argument takes (420).
func octalMode(m uint32) string { return fmt.Sprintf("%04o", m) }

// resolveFile is the path to open: p itself, or, when the policy allows
// following symlinks, the real path the guest resolves p to, which the
// policy must allow too. The returned path is opened without following
// any symlink, so what the policy saw is what is opened.
func resolveFile(e *catalog.Env, c *catalog.Call, h *guestctl.Helper, p string, forWrite bool) (string, *catalog.Result) {
	if !c.FileRules().FollowSymlinks {
		return p, nil
	}
	info, err := h.FileStat(c.Ctx, c.Name, p, true, forWrite)
	if err != nil {
		r := fileFailure(err)
		return "", &r
	}
	if info.Path == p {
		return p, nil
	}
	if r := e.Redecide(c, "path", info.Path); r != nil {
		return "", r
	}
	return info.Path, nil
}

// fileFailure maps a helper error of a file command: the guest's refusals
// (a symlink, setuid bits, a hard link) are the policy's, worded by the
// guest with the component it refused.
func fileFailure(err error) catalog.Result {
	var he *guestctl.Error
	if errors.As(err, &he) {
		switch {
		case he.Code == wire.CodeRefused && he.Reason != wire.ReasonNotRegular:
			r := catalog.Failure(catalog.TagDenied, strings.TrimPrefix(he.Message, he.Op+": "), true)
			r.Structured = map[string]any{"error": strings.Trim(catalog.TagDenied, "[]"), "message": r.Text, "refused": he.Reason}
			r.Detail = err.Error()
			return r
		case he.Code == wire.CodeRefused, he.Code == wire.CodeNotFound, he.Code == wire.CodeInvalid:
			r := catalog.Failure(catalog.TagInvalid, catalog.FileCause(catalog.CleanReason(strings.TrimPrefix(he.Message, he.Op+": "))), true)
			r.Detail = err.Error()
			return r
		}
	}
	return catalog.HelperFailure(err)
}

// isText reports whether a file's data is text: valid UTF-8 without NUL
// bytes (a NUL is valid UTF-8, and a binary file full of them would come
// back as "\u0000…"; like git and file(1), a NUL says binary).
func isText(data []byte) bool {
	return utf8.Valid(data) && bytes.IndexByte(data, 0) < 0
}
