package server

import (
	"encoding/base64"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// Files: vm_file_read and vm_file_write, through the driver's file channel.

func fileReadTool(l Limits) *toolSpec {
	return newTool(toolSpec{
		name: "vm_file_read", title: "Read a file", readOnly: true, idempotent: true,
		desc: "Read a file in a VM. Text comes back as content, anything else as content_base64; truncated says whether the file was longer than max_bytes.",
		fields: []field{
			vmField(true),
			{name: "path", kind: kindString, desc: "Absolute path in the guest.", required: true, maxLen: 4096},
			{name: "max_bytes", kind: kindInteger, desc: fmt.Sprintf("Read at most this many bytes; the server caps it at %d.", l.MaxOutputBytes), min: 1, max: math.MaxInt64},
		},
	}, (*Server).runFileRead)
}

func fileWriteTool() *toolSpec {
	return newTool(toolSpec{
		name: "vm_file_write", title: "Write a file", destructive: true, idempotent: true,
		desc: "Create or replace a file in a VM. Give exactly one of content (text) or content_base64 (bytes).",
		fields: []field{
			vmField(true),
			{name: "path", kind: kindString, desc: "Absolute path in the guest.", required: true, maxLen: 4096},
			{name: "content", kind: kindString, desc: "The new content as text.", allowNUL: true},
			{name: "content_base64", kind: kindString, desc: "The new content, base64 encoded."},
			{name: "mode", kind: kindInteger, desc: "Permission bits as a number (420 = 0644); default: the guest's.", min: 0, max: 0o7777},
		},
		exactlyOne: [][]string{{"content", "content_base64"}},
	}, (*Server).runFileWrite)
}

// fileReadArgs are vm_file_read's arguments.
type fileReadArgs struct {
	Path     string `arg:"path"`
	MaxBytes int64  `arg:"max_bytes"` // 0: the server's cap
}

func (s *Server) runFileRead(c *call, a *fileReadArgs) result {
	p := a.Path
	if !strings.HasPrefix(p, "/") {
		return failure(TagInvalid, "path must be absolute", true)
	}
	fc, err := c.driver.FileRead(c.ctx, c.name, p, s.outputCap(a.MaxBytes))
	if err != nil {
		return driverFailure(err)
	}
	out := map[string]any{"path": p, "bytes": len(fc.Data), "truncated": fc.Truncated}
	putBytes(out, "content", fc.Data)
	text := string(fc.Data)
	if !utf8.Valid(fc.Data) {
		text = fmt.Sprintf("(%d bytes of binary data, see content_base64)", len(fc.Data))
	}
	if fc.Truncated {
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
	Mode          int64   `arg:"mode"` // 0: the guest's default
}

// data is the content to write.
func (a *fileWriteArgs) data() ([]byte, error) {
	if a.Content != nil {
		return []byte(*a.Content), nil
	}
	return base64.StdEncoding.DecodeString(*a.ContentBase64)
}

func (s *Server) runFileWrite(c *call, a *fileWriteArgs) result {
	p := a.Path
	if !strings.HasPrefix(p, "/") {
		return failure(TagInvalid, "path must be absolute", true)
	}
	data, err := a.data()
	if err != nil {
		return failure(TagInvalid, "content_base64 is not valid base64", true)
	}
	if err := c.driver.FileWrite(c.ctx, c.name, p, data, uint32(a.Mode)); err != nil {
		return driverFailure(err)
	}
	return success(map[string]any{"path": p, "bytes_written": len(data)}, fmt.Sprintf("wrote %d bytes to %s", len(data), p))
}
