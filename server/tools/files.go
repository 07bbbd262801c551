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

// maxOffset bounds an offset: far past any file, and far enough from
// MaxInt64 that an offset and a length never overflow (the kernel's EINVAL).
const maxOffset = 1 << 62

func fileReadTool(l catalog.Limits) *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "vm_file_read", Title: "Read a file", ReadOnly: true, Idempotent: true,
		Desc: "Read a regular file in a VM, whole or a range of it (offset, length), with the whole file's SHA-256 on request (hash), so that a large file comes in pieces that can be checked. Text comes back as content, anything else as content_base64; size is the file's size, offset and bytes the range read, eof whether it reached the end. A symlink anywhere in the path is refused unless the policy allows following symlinks; then path is the real path read.",
		Fields: []catalog.Field{
			catalog.VMField(true),
			{Name: "path", Kind: catalog.KindString, Desc: "Absolute, clean path in the guest (no \".\", \"..\", \"//\" or trailing \"/\").", Required: true, MaxLen: 4096, GuestPath: true},
			{Name: "max_bytes", Kind: catalog.KindInteger, Desc: fmt.Sprintf("Read at most this many bytes from the start; the server caps it at %d. For more, give offset and length instead.", l.MaxOutputBytes), Min: 1, Max: math.MaxInt64},
			{Name: "offset", Kind: catalog.KindInteger, Desc: "Where the range starts, in bytes (default 0; at most 2^62); at or past the end reads nothing, with eof.", Min: 0, Max: maxOffset},
			{Name: "length", Kind: catalog.KindInteger, Desc: fmt.Sprintf("The most to read from offset; the policy caps one range (files.max_read_bytes, default %d), and one result carries at most %d bytes (base64 of binary data: about %d): a longer range comes back shorter, truncated, saying where to read on. 0 with hash reads only the hash.", policy.DefaultMaxReadBytes, l.MaxMessageBytes, l.RawBudget()), Min: 0, Max: math.MaxInt64},
			{Name: "hash", Kind: catalog.KindBoolean, Desc: "Also return sha256, the whole file's SHA-256 (read in the same pass)."},
		},
		Output: []map[string]any{catalog.OObject(map[string]any{
			"path": catalog.OString(), "requested_path": catalog.OString(), "bytes": catalog.ONonNeg(), "truncated": catalog.OBoolean(),
			"mode": catalog.ONonNeg(), "mode_octal": catalog.OString(), "size": catalog.ONonNeg(), "content": catalog.OString(), "content_base64": catalog.OString(),
			"offset": catalog.ONonNeg(), "eof": catalog.OBoolean(), "sha256": catalog.OString(),
		}, "path", "bytes", "truncated", "offset", "eof")},
	}, runFileRead)
}

func fileWriteTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "vm_file_write", Title: "Write a file", Destructive: true,
		Desc: "Create or replace a regular file in a VM, or write into one. Give exactly one of content (text) or content_base64 (bytes). A whole-file write is atomic: a temporary file in the same directory, fsynced, renamed over the old one, so a failed write leaves the old file as it was. offset writes into the existing file there, append at its end: in place, not atomic; expect_sha256 refuses the write if the file is no longer what was read. The last path component is never followed if it is a symlink, nor any other symlink unless the policy allows it; a new file gets mode 0644 (or the policy's default) unless mode is given; setuid, setgid and sticky bits need the policy's leave.",
		Fields: []catalog.Field{
			catalog.VMField(true),
			{Name: "path", Kind: catalog.KindString, Desc: "Absolute, clean path in the guest (no \".\", \"..\", \"//\" or trailing \"/\").", Required: true, MaxLen: 4096, GuestPath: true},
			{Name: "content", Kind: catalog.KindString, Desc: "The new content as text.", AllowNUL: true},
			{Name: "content_base64", Kind: catalog.KindString, Desc: "The new content, base64 encoded."},
			{Name: "mode", Kind: catalog.KindInteger, Desc: "Permission bits as a number (420 = 0644), as the result's mode reports them (mode_octal spells them \"0644\"). Default: an existing file keeps its mode, a new one gets 0644 or the policy's default.", Min: 0, Max: 0o7777},
			{Name: "offset", Kind: catalog.KindInteger, Desc: "Write into the existing file at this byte offset (in place; at most its size, so no hole).", Min: 0, Max: maxOffset},
			{Name: "append", Kind: catalog.KindBoolean, Desc: "Write at the end of the existing file (in place)."},
			{Name: "expect_sha256", Kind: catalog.KindString, Desc: "The file's SHA-256 (64 hex digits) as last read: the write is refused if the file is not that any more.", MaxLen: 64},
			{Name: "hash", Kind: catalog.KindBoolean, Desc: "Also return sha256, the file's SHA-256 after the write."},
		},
		ExactlyOne: [][]string{{"content", "content_base64"}},
		Output: []map[string]any{catalog.OObject(map[string]any{
			"path": catalog.OString(), "requested_path": catalog.OString(), "bytes_written": catalog.ONonNeg(), "mode": catalog.ONonNeg(), "mode_octal": catalog.OString(), "created": catalog.OBoolean(),
			"offset": catalog.ONonNeg(), "atomic": catalog.OBoolean(), "guarantee": catalog.OString(), "sha256": catalog.OString(),
		}, "path", "bytes_written", "offset", "atomic", "guarantee")},
	}, runFileWrite)
}

// fileReadArgs are vm_file_read's arguments.
type fileReadArgs struct {
	Path     string `arg:"path"`
	MaxBytes int64  `arg:"max_bytes"` // 0: the server's cap
	Offset   int64  `arg:"offset"`
	Length   *int64 `arg:"length"` // nil: max_bytes' rule
	Hash     bool   `arg:"hash"`
}

// CheckArgs: max_bytes is the old whole-file cap, length the range's.
func (a *fileReadArgs) CheckArgs() error {
	if a.MaxBytes != 0 && a.Length != nil {
		return errors.New("give length or max_bytes, not both (length reads a range from offset)")
	}
	if a.Length != nil && *a.Length == 0 && !a.Hash {
		return errors.New("length 0 reads nothing: give a length of 1 or more, or hash: true for the hash alone")
	}
	return nil
}

// readOptions is the range to read: length capped by the policy, or
// max_bytes capped by the server's output cap; and then by what one
// result carries (budget.go). wanted is the length before that last cap.
func (a *fileReadArgs) readOptions(e *catalog.Env, rules policy.FileRules) (o guestctl.ReadOptions, wanted int64) {
	n := min(e.OutputCap(a.MaxBytes), wire.MaxFileReadBytes)
	if a.Length != nil {
		n = min(*a.Length, rules.MaxReadBytes, wire.MaxReadLength)
	}
	return guestctl.ReadOptions{Offset: a.Offset, Length: min(n, e.Limits.RawBudget()), Hash: a.Hash}, n
}

func runFileRead(e *catalog.Env, c *catalog.Call, a *fileReadArgs) catalog.Result {
	if err := guestctl.CheckPath("vm_file_read", a.Path); err != nil {
		return catalog.Failure(catalog.TagInvalid, "path "+catalog.PathProblem(err), true)
	}
	h, p, r := helperAt(e, c, a.Path, false)
	if r != nil {
		return *r
	}
	o, wanted := a.readOptions(e, c.FileRules())
	o.Progress = bytesMoved(c)
	fr, err := h.FileReadRange(c.Ctx, c.Name, p, o)
	if err != nil {
		return fileFailure(err)
	}
	fitText(e, &fr)
	out := map[string]any{"path": fr.Path, "bytes": len(fr.Data), "truncated": fr.Truncated, "mode": fr.Mode, "mode_octal": octalMode(fr.Mode), "size": fr.Size,
		"offset": fr.Offset, "eof": fr.EOF}
	if fr.Path != a.Path {
		out["requested_path"] = a.Path
	}
	if fr.SHA256 != "" {
		out["sha256"] = fr.SHA256
	}
	text := string(fr.Data)
	if isText(fr.Data) {
		out["content"] = text
	} else {
		out["content_base64"] = base64.StdEncoding.EncodeToString(fr.Data)
		text = fmt.Sprintf("(%d bytes of binary data, see content_base64)", len(fr.Data))
	}
	if fr.Offset != 0 || a.Length != nil {
		text = fmt.Sprintf("(bytes %d..%d of %d)\n", fr.Offset, fr.Offset+int64(len(fr.Data)), fr.Size) + text
	}
	switch next := fr.Offset + int64(len(fr.Data)); {
	case fr.Truncated && int64(len(fr.Data)) < wanted:
		text += "\n(truncated: " + e.Limits.ReadOnNote(next) + ")"
	case fr.Truncated:
		text += fmt.Sprintf("\n(truncated: the file goes on; read on with offset %d)", next)
	}
	if fr.SHA256 != "" {
		text += "\nsha256 " + fr.SHA256
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
	Offset        *int64  `arg:"offset"`
	Append        bool    `arg:"append"`
	ExpectSHA256  string  `arg:"expect_sha256"`
	Hash          bool    `arg:"hash"`
}

// CheckArgs refuses what no guest needs to see: content that is not
// base64, offset with append, a malformed expect_sha256.
func (a *fileWriteArgs) CheckArgs() error {
	if _, err := a.data(); err != nil {
		return errors.New("content_base64 is not valid base64")
	}
	if a.Offset != nil && a.Append {
		return errors.New("offset and append do not go together: append writes at the end, offset where it says")
	}
	if a.ExpectSHA256 != "" {
		if _, err := wire.CheckSHA256(a.ExpectSHA256); err != nil {
			return fmt.Errorf("expect_sha256: %w", err)
		}
	}
	return nil
}

// data is the content to write.
func (a *fileWriteArgs) data() ([]byte, error) {
	if a.Content != nil {
		return []byte(*a.Content), nil
	}
	if a.ContentBase64 == nil {
		return nil, nil
	}
	return base64.StdEncoding.DecodeString(*a.ContentBase64)
}

// options are the guest's write options under rules, or the refusal of a
// mode the policy does not allow.
func (a *fileWriteArgs) options(rules policy.FileRules) (guestctl.WriteOptions, *catalog.Result) {
	o := guestctl.WriteOptions{CreateMode: rules.DefaultMode, SpecialBits: rules.SpecialBits, Offset: a.Offset, Append: a.Append, ExpectSHA256: a.ExpectSHA256, Hash: a.Hash}
	if a.Mode != nil {
		m := uint32(*a.Mode)
		if m&policy.SpecialModeBits != 0 && !rules.SpecialBits {
			r := catalog.Failure(catalog.TagDenied, fmt.Sprintf("mode %#o sets setuid, setgid or sticky bits, which the policy does not allow (files.special_bits); give a mode without them, such as %#o", m, m&0o777), true)
			return o, &r
		}
		o.Mode = &m
	}
	return o, nil
}

func runFileWrite(e *catalog.Env, c *catalog.Call, a *fileWriteArgs) catalog.Result {
	if err := guestctl.CheckPath("vm_file_write", a.Path); err != nil {
		return catalog.Failure(catalog.TagInvalid, "path "+catalog.PathProblem(err), true)
	}
	data, err := a.data()
	if err != nil {
		return catalog.Failure(catalog.TagInvalid, "content_base64 is not valid base64", true)
	}
	o, r := a.options(c.FileRules())
	if r != nil {
		return *r
	}
	h, p, r := helperAt(e, c, a.Path, true)
	if r != nil {
		return *r
	}
	o.Progress = bytesMoved(c)
	fw, err := h.FileWrite(c.Ctx, c.Name, p, data, o)
	if err != nil {
		return fileFailure(err)
	}
	guarantee := "atomic: the old file was replaced whole by a rename (or the new one linked in), never seen half written"
	if !fw.Atomic {
		guarantee = "in place: written into the existing file, which a failure may leave part written (expect_sha256 checks it before)"
	}
	out := map[string]any{"path": fw.Path, "bytes_written": fw.Bytes, "mode": fw.Mode, "mode_octal": octalMode(fw.Mode), "created": fw.Created,
		"offset": fw.Offset, "atomic": fw.Atomic, "guarantee": guarantee}
	if fw.Path != a.Path {
		out["requested_path"] = a.Path
	}
	text := fmt.Sprintf("wrote %d bytes to %s at offset %d (mode %04o; %s)", fw.Bytes, fw.Path, fw.Offset, fw.Mode, guarantee)
	if fw.SHA256 != "" {
		out["sha256"] = fw.SHA256
		text += "\nsha256 " + fw.SHA256
	}
	return catalog.Success(out, text)
}

// octalMode is a file mode as people write it ("0644"); a result's mode is
// the number vm_file_write's mode argument takes (420).
func octalMode(m uint32) string { return fmt.Sprintf("%04o", m) }

// helperAt is the call's vmgate-guest helper and the path to open for p
// (resolveFile), or the refusal.
func helperAt(e *catalog.Env, c *catalog.Call, p string, forWrite bool) (*guestctl.Helper, string, *catalog.Result) {
	h, r := e.Guest.HelperFor(c)
	if r != nil {
		return nil, "", r
	}
	real, r := resolveFile(e, c, h, p, forWrite)
	return h, real, r
}

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
		case he.Code == wire.CodeRefused && he.Reason == wire.ReasonChanged:
			r := catalog.Failure(catalog.TagInvalid, "the file changed since it was read (expect_sha256 no longer matches), so nothing was written: read it again with hash: true and write against its new sha256", true)
			r.Structured = map[string]any{"error": strings.Trim(catalog.TagInvalid, "[]"), "message": r.Text, "refused": he.Reason}
			r.Detail = err.Error()
			return r
		case he.Code == wire.CodeRefused && he.Reason == wire.ReasonLimit:
			r := catalog.Failure(catalog.TagInvalid, catalog.GuestCause(catalog.CleanReason(strings.TrimPrefix(he.Message, he.Op+": ")))+"; the policy's caps are files.max_archive_bytes and files.max_entries", true)
			r.Detail = err.Error()
			return r
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
