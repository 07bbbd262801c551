package policy

import (
	"fmt"
	"strconv"
)

// The files block says what vm_file_read and vm_file_write may do with the
// file a path names, beyond the path rules (which see the path's text):
//
//	"vm_file_write": {
//	  "require": [{"path": "args.path", "op": "glob", "value": "/srv/out/*"}],
//	  "files": {
//	    "follow_symlinks": false, // default: a symlink anywhere in the path is refused
//	    "default_mode": "0644",   // vm_file_write: the mode of a new file when the call gives none
//	    "special_bits": false     // vm_file_write: setuid, setgid and sticky bits refused
//	  }
//	}
//
// It sits on a file tool's entry, or on vm_agent_exec's, whose cwd names a
// directory the same way (there only follow_symlinks applies). With
// follow_symlinks the guest resolves the path first and the policy decides
// again on the real path, so a symlink leads only where the path rules
// would let a plain path go; even then the last component of a write is
// never followed. Without a block (or for an unlisted tool under
// "default": "allow") the defaults apply: no symlinks, 0644, no special bits.
//
// The directory and archive tools (vm_dir_list, vm_archive_read,
// vm_archive_write) take the same block, and the path rules see every
// entry of an archive as args.path (the handler asks again per entry).
// Their caps and leaves:
//
//	"files": {
//	  "max_read_bytes": 16777216,   // vm_file_read: one range at most (default 16 MiB, up to 256 MiB)
//	  "max_archive_bytes": 67108864, // archives: the files' content (default 64 MiB, up to 4 GiB)
//	  "max_entries": 10000,          // archives: entries; vm_dir_list: entries listed
//	  "devices": false,              // vm_archive_write: devices and FIFOs
//	  "symlinks_out": false,         // vm_archive_write: symlinks pointing out of the target
//	  "denied_entries": "skip"       // an entry the path rules refuse: "skip" it, or "refuse" the whole call
//	}

// FileTools are the tools a files block may sit on.
func FileTools() []string {
	return []string{"vm_file_read", "vm_file_write", ExecTool, "vm_dir_list", "vm_archive_read", "vm_archive_write"}
}

// File caps: defaults and the most a policy may set.
const (
	DefaultMaxReadBytes    = 16 << 20
	MaxMaxReadBytes        = 256 << 20
	DefaultMaxArchiveBytes = 64 << 20
	MaxMaxArchiveBytes     = 4 << 30
	DefaultMaxEntries      = 10000
	MaxMaxEntries          = 1000000
)

// ExecTool is vm_agent_exec, whose files block has follow_symlinks only.
const ExecTool = "vm_agent_exec"

// FileRules is what a file tool's call may do (Decision.Files).
type FileRules struct {
	FollowSymlinks bool
	DefaultMode    uint32 // permission bits of a new file the call gives no mode for
	SpecialBits    bool   // setuid, setgid and sticky allowed
	// MaxReadBytes caps one vm_file_read range.
	MaxReadBytes int64
	// MaxArchiveBytes and MaxEntries cap an archive (its files' content,
	// its entries) and a directory listing (entries).
	MaxArchiveBytes int64
	MaxEntries      int
	Devices         bool // vm_archive_write: devices and FIFOs allowed
	SymlinksOut     bool // vm_archive_write: symlinks pointing out of the target allowed
	// RefuseDeniedEntries: an archive entry the path rules refuse fails
	// the whole call; without it the entry is skipped and reported.
	RefuseDeniedEntries bool
}

// DefaultFileRules are the rules without a files block.
func DefaultFileRules() FileRules {
	return FileRules{DefaultMode: 0o644, MaxReadBytes: DefaultMaxReadBytes, MaxArchiveBytes: DefaultMaxArchiveBytes, MaxEntries: DefaultMaxEntries}
}

// SpecialModeBits are setuid, setgid and sticky.
const SpecialModeBits = 0o7000

func isFileTool(name string) bool {
	for _, t := range FileTools() {
		if t == name {
			return true
		}
	}
	return false
}

// fileRules is the Decision.Files of a call of tool t: nil when not a file
// tool, and for vm_agent_exec without a files block (the defaults, which
// its handler applies; so a plain exec's decision allocates nothing more).
func fileRulesFor(t *toolRule, tool string) *FileRules {
	if !isFileTool(tool) || tool == ExecTool && (t == nil || t.files == nil) {
		return nil
	}
	r := DefaultFileRules()
	if t != nil && t.files != nil {
		r = *t.files
	}
	return &r
}

func (b *builder) files(n *node, l loc, tool string) *FileRules {
	r := DefaultFileRules()
	keys := []string{"follow_symlinks", "default_mode", "special_bits", "max_read_bytes", "max_archive_bytes", "max_entries", "devices", "symlinks_out", "denied_entries"}
	if tool == ExecTool {
		keys = keys[:1] // a cwd is entered, never made
	}
	m, ok := b.object(n, l, keys...)
	if !ok {
		return &r
	}
	boolean := func(k string) bool {
		v, ok := m[k]
		if !ok {
			return false
		}
		if v.kind != kindBool {
			b.errorf(v.off, l.key(k).path, "want true or false, got %s", v.kind)
			return false
		}
		return v.b
	}
	r.FollowSymlinks = boolean("follow_symlinks")
	r.SpecialBits = boolean("special_bits")
	r.Devices = boolean("devices")
	r.SymlinksOut = boolean("symlinks_out")
	r.MaxReadBytes = b.fileCap(m, l, "max_read_bytes", DefaultMaxReadBytes, MaxMaxReadBytes)
	r.MaxArchiveBytes = b.fileCap(m, l, "max_archive_bytes", DefaultMaxArchiveBytes, MaxMaxArchiveBytes)
	r.MaxEntries = int(b.fileCap(m, l, "max_entries", DefaultMaxEntries, MaxMaxEntries))
	if v, ok := m["denied_entries"]; ok {
		if s, ok := b.str(v, l.key("denied_entries")); ok {
			switch s {
			case "skip":
			case "refuse":
				r.RefuseDeniedEntries = true
			default:
				b.errorf(v.off, l.key("denied_entries").path, "want \"skip\" or \"refuse\", got %q", s)
			}
		}
	}
	if v, ok := m["default_mode"]; ok {
		lm := l.key("default_mode")
		if s, ok := b.str(v, lm); ok {
			mode, err := ParseFileMode(s)
			switch {
			case err != nil:
				b.errorf(v.off, lm.path, "%v", err)
			case mode&SpecialModeBits != 0 && !r.SpecialBits:
				b.errorf(v.off, lm.path, "default mode %s has setuid, setgid or sticky bits and special_bits is not true", s)
			}
			r.DefaultMode = mode
		}
	}
	return &r
}

// fileCap is the files block's integer k, def when absent, in 1..most.
func (b *builder) fileCap(m map[string]*node, l loc, k string, def, most int64) int64 {
	v, ok := m[k]
	if !ok {
		return def
	}
	lk := l.key(k)
	n, ok := b.integer(v, lk)
	if !ok {
		return def
	}
	if n < 1 || n > most {
		b.errorf(v.off, lk.path, "%d out of range 1..%d", n, most)
		return def
	}
	return n
}

// ParseFileMode reads an octal mode of three or four digits ("0644", "755").
func ParseFileMode(s string) (uint32, error) {
	if len(s) < 3 || len(s) > 4 {
		return 0, fmt.Errorf("mode %q: want three or four octal digits, such as \"0644\"", s)
	}
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil {
		return 0, fmt.Errorf("mode %q: want three or four octal digits, such as \"0644\"", s)
	}
	return uint32(v), nil
}
