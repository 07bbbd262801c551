package server

import (
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"math"
	"strings"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/policy"
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

func fileReadTool(l Limits) *toolSpec {
	return newTool(toolSpec{
		name: "vm_file_read", title: "Read a file", readOnly: true, idempotent: true,
		desc: "Read a regular file in a VM. Text comes back as content, anything else as content_base64; truncated says whether the file was longer than max_bytes. A symlink anywhere in the path is refused unless the policy allows following symlinks; then path is the real path read.",
		fields: []field{
			vmField(true),
			{name: "path", kind: kindString, desc: "Absolute, clean path in the guest (no \".\", \"..\", \"//\" or trailing \"/\").", required: true, maxLen: 4096, guestPath: true},
			{name: "max_bytes", kind: kindInteger, desc: fmt.Sprintf("Read at most this many bytes; the server caps it at %d.", l.MaxOutputBytes), min: 1, max: math.MaxInt64},
		},
		output: []map[string]any{oObject(map[string]any{
			"path": oString, "requested_path": oString, "bytes": oNonNeg, "truncated": oBoolean,
			"mode": oString, "size": oNonNeg, "content": oString, "content_base64": oString,
		}, "path", "bytes", "truncated")},
	}, (*Server).runFileRead)
}

func fileWriteTool() *toolSpec {
	return newTool(toolSpec{
		name: "vm_file_write", title: "Write a file", destructive: true, idempotent: true,
		desc: "Create or replace a regular file in a VM. Give exactly one of content (text) or content_base64 (bytes). The last path component is never followed if it is a symlink, nor any other symlink unless the policy allows it; a new file gets mode 0644 (or the policy's default) unless mode is given; setuid, setgid and sticky bits need the policy's leave.",
		fields: []field{
			vmField(true),
			{name: "path", kind: kindString, desc: "Absolute, clean path in the guest (no \".\", \"..\", \"//\" or trailing \"/\").", required: true, maxLen: 4096, guestPath: true},
			{name: "content", kind: kindString, desc: "The new content as text.", allowNUL: true},
			{name: "content_base64", kind: kindString, desc: "The new content, base64 encoded."},
			{name: "mode", kind: kindInteger, desc: "Permission bits as a number (420 = 0644). Default: an existing file keeps its mode, a new one gets 0644 or the policy's default.", min: 0, max: 0o7777},
		},
		exactlyOne: [][]string{{"content", "content_base64"}},
		output: []map[string]any{oObject(map[string]any{
			"path": oString, "requested_path": oString, "bytes_written": oNonNeg, "mode": oString, "created": oBoolean,
		}, "path", "bytes_written")},
	}, (*Server).runFileWrite)
}

// fileReadArgs are vm_file_read's arguments.
type fileReadArgs struct {
	Path     string `arg:"path"`
	MaxBytes int64  `arg:"max_bytes"` // 0: the server's cap
}

// fileRules are the call's file rules (the defaults for a decision without them).
func (c *call) fileRules() policy.FileRules {
	if c.files != nil {
		return *c.files
	}
	return policy.DefaultFileRules
}

func (s *Server) runFileRead(c *call, a *fileReadArgs) result {
	if err := guestctl.CheckPath("vm_file_read", a.Path); err != nil {
		return failure(TagInvalid, "path "+pathProblem(err), true)
	}
	h, r := s.guest.helperFor(c)
	if r != nil {
		return *r
	}
	p, r := s.resolveFile(c, h, a.Path, false)
	if r != nil {
		return *r
	}
	fr, err := h.FileRead(c.ctx, c.name, p, min(s.outputCap(a.MaxBytes), wire.MaxFileReadBytes))
	if err != nil {
		return fileFailure(err)
	}
	out := map[string]any{"path": fr.Path, "bytes": len(fr.Data), "truncated": fr.Truncated, "mode": fmt.Sprintf("%04o", fr.Mode), "size": fr.Size}
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
	return success(out, text)
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

func (s *Server) runFileWrite(c *call, a *fileWriteArgs) result {
	if err := guestctl.CheckPath("vm_file_write", a.Path); err != nil {
		return failure(TagInvalid, "path "+pathProblem(err), true)
	}
	data, err := a.data()
	if err != nil {
		return failure(TagInvalid, "content_base64 is not valid base64", true)
	}
	rules := c.fileRules()
	o := guestctl.WriteOptions{CreateMode: rules.DefaultMode, SpecialBits: rules.SpecialBits}
	if a.Mode != nil {
		m := uint32(*a.Mode)
		if m&policy.SpecialModeBits != 0 && !rules.SpecialBits {
			return failure(TagDenied, fmt.Sprintf("mode %#o sets setuid, setgid or sticky bits, which the policy does not allow (files.special_bits); give a mode without them, such as %#o", m, m&0o777), true)
		}
		o.Mode = &m
	}
	h, r := s.guest.helperFor(c)
	if r != nil {
		return *r
	}
	p, r := s.resolveFile(c, h, a.Path, true)
	if r != nil {
		return *r
	}
	fw, err := h.FileWrite(c.ctx, c.name, p, data, o)
	if err != nil {
		return fileFailure(err)
	}
	out := map[string]any{"path": fw.Path, "bytes_written": fw.Bytes, "mode": fmt.Sprintf("%04o", fw.Mode), "created": fw.Created}
	if fw.Path != a.Path {
		out["requested_path"] = a.Path
	}
	return success(out, fmt.Sprintf("wrote %d bytes to %s (mode %04o)", fw.Bytes, fw.Path, fw.Mode))
}

// pathProblem is guestctl's complaint about a path, without its prefix.
func pathProblem(err error) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, "invalid argument: "); i >= 0 {
		msg = msg[i+len("invalid argument: "):]
	}
	return msg
}

// resolveFile is the path to open: p itself, or, when the policy allows
// following symlinks, the real path the guest resolves p to, which the
// policy must allow too. The returned path is opened without following
// any symlink, so what the policy saw is what is opened.
func (s *Server) resolveFile(c *call, h *guestctl.Helper, p string, forWrite bool) (string, *result) {
	if !c.fileRules().FollowSymlinks {
		return p, nil
	}
	info, err := h.FileStat(c.ctx, c.name, p, true, forWrite)
	if err != nil {
		r := fileFailure(err)
		return "", &r
	}
	if info.Path == p {
		return p, nil
	}
	if r := s.redecide(c, "path", info.Path); r != nil {
		return "", r
	}
	return info.Path, nil
}

// redecide asks the grant's policy again with the real path in place of
// the path as given in argument key ("path", or vm_agent_exec's "cwd").
// Only an allow (or a shadow-mode decision) lets the call go on: an
// approval was for the path as given, not for where it leads.
func (s *Server) redecide(c *call, key, real string) *result {
	eng := s.policyOf(c.grant)
	if eng == nil {
		r := failure(TagDenied, "this grant has no policy, so it can do nothing", true)
		return &r
	}
	args := maps.Clone(c.argMap)
	args[key] = real
	d := eng.Decide(policy.Call{Grant: c.grant.Name, Transport: c.transport, Tool: c.spec.name, VM: c.vm, Args: args})
	what := "the path"
	if key != "path" {
		what = key
	}
	switch {
	case d.Shadow || d.Verdict == policy.Allow:
		s.log.Info("server: path resolved through symlinks", "call", c.id, key, c.argMap[key], "real", real, "shadow", d.Shadow)
		return nil
	case d.Verdict == policy.Approve:
		r := failure(TagDenied, fmt.Sprintf("%s leads through symlinks to %s, which needs an approval of its own: call again with %s %q", what, real, key, real), true)
		return &r
	}
	why := d.Reason
	if why == "" {
		why = "the policy does not allow it"
	}
	r := failure(TagDenied, fmt.Sprintf("%s leads through symlinks to %s, which the policy does not allow: %s", what, real, why), true)
	r.detail = fmt.Sprintf("%s %v resolves to %s; rule %s: %s", key, c.argMap[key], real, d.Rule, d.Reason)
	return &r
}

// fileFailure maps a helper error of a file command: the guest's refusals
// (a symlink, setuid bits, a hard link) are the policy's, worded by the
// guest with the component it refused.
func fileFailure(err error) result {
	var he *guestctl.Error
	if errors.As(err, &he) {
		switch {
		case he.Code == wire.CodeRefused && he.Reason != wire.ReasonNotRegular:
			r := failure(TagDenied, strings.TrimPrefix(he.Message, he.Op+": "), true)
			r.structured = map[string]any{"error": strings.Trim(TagDenied, "[]"), "message": r.text, "refused": he.Reason}
			r.detail = err.Error()
			return r
		case he.Code == wire.CodeRefused, he.Code == wire.CodeNotFound, he.Code == wire.CodeInvalid:
			r := failure(TagInvalid, guestCause(cleanReason(strings.TrimPrefix(he.Message, he.Op+": "))), true)
			r.detail = err.Error()
			return r
		}
	}
	return helperFailure(err)
}
