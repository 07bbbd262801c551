package wire

import (
	"encoding/hex"
	"fmt"
	"strings"
)

// Files: the requests and replies of file stat, read and write, dir list
// and the archive commands, and where a command's bulk data travels.

// More refusal reasons of the file commands (Error.Reason when Code is
// CodeRefused; ArchiveEntry.Reason).
const (
	// ReasonChanged: expect_sha256 did not match the file as it is.
	ReasonChanged = "file changed"
	// ReasonSpecial: a device, FIFO or socket.
	ReasonSpecial = "device or special file"
	// ReasonOutside: an archive entry's name leaves the target directory
	// (an absolute name, "..").
	ReasonOutside = "path leaves the target"
	// ReasonLinkOut: a symlink whose target leaves the target directory,
	// or a hard link to anything but a file this archive wrote.
	ReasonLinkOut = "link leaves the target"
	// ReasonConflict: something of another type is already there (a
	// directory where a file goes, a symlink where a directory goes).
	ReasonConflict = "conflicts with what is there"
	// ReasonUnsupported: a tar entry type vmgate does not write.
	ReasonUnsupported = "unsupported entry type"
	// ReasonPolicy: the host's policy refused the entry (archive write --skip).
	ReasonPolicy = "refused by the policy"
	// ReasonLimit: an archive over its limits (entries, bytes).
	ReasonLimit = "over the limits"
)

// Limits of the file commands.
const (
	// MaxFileReadBytes caps what one legacy file read (--max-bytes) returns.
	MaxFileReadBytes = 16 << 20
	// DefaultReadLength is a ranged read's length when none is given.
	DefaultReadLength = 16 << 20
	// MaxReadLength bounds one ranged read; the host's cap (the policy's) is
	// usually lower.
	MaxReadLength = 256 << 20
	// PieceBytes is the most one staging file holds: data larger than that
	// moves as several, so no message of the driver's file channel carries
	// more.
	PieceBytes = 16 << 20
	// SmallPieceBytes is what the first SmallPieces staging files of a
	// command hold (the host's and the guest's alike): a piece is the step
	// in which a transfer's progress is reported, so a 16 MiB range moves
	// in four; larger data goes on in pieces of PieceBytes, so that
	// MaxPieces still carry gigabytes. Reading or writing a piece costs an
	// open and a close of the file channel on top of its data (a few
	// milliseconds on a lab guest).
	SmallPieceBytes = 4 << 20
	SmallPieces     = 256
	// MaxPieces bounds the staging files one command takes or makes.
	MaxPieces = 1024
	// InlineMax is where --out auto switches from data after the reply
	// (exec output) to staging files (the file channel). On a lab guest
	// (QEMU, TCG) 256 KiB costs the same both ways (about 120 ms); 1 MiB
	// takes 460 ms as exec output and 340 ms staged, 16 MiB twice as long
	// as exec output (qemu-ga gathers output 4 KiB at a time).
	InlineMax = 256 << 10
)

// PieceCap is the most the i-th staging piece (from 0) of one command holds.
func PieceCap(i int) int64 {
	if i < SmallPieces {
		return SmallPieceBytes
	}
	return PieceBytes
}

// Limits of dir list.
const (
	DefaultDirDepth   = 1
	MaxDirDepth       = 64
	DefaultDirEntries = 1000
	MaxDirEntries     = 50000
)

// Limits of the archive commands; the host passes the policy's, within these.
const (
	DefaultArchiveBytes   = 64 << 20
	MaxArchiveBytes       = 4 << 30
	DefaultArchiveEntries = 10000
	MaxArchiveEntries     = 1000000
)

// DataOut is where a command's data output went (Reply.Data).
type DataOut struct {
	// Bytes is the data's length.
	Bytes int64 `json:"bytes"`
	// Staged lists the staging files holding the data, in order, each at
	// most PieceBytes; empty: the data follows the reply's line on stdout.
	// The host reads them with the driver's file channel and removes them
	// (file unstage).
	Staged []Piece `json:"staged,omitempty"`
}

// Piece is one staging file and its length.
type Piece struct {
	Path  string `json:"path"`
	Bytes int64  `json:"bytes"`
}

// FileInfo is a file as the guest resolved it (file stat, and part of the
// read and write replies).
type FileInfo struct {
	// Path is the real path: absolute, clean, no symlink in it.
	Path   string `json:"path"`
	Exists bool   `json:"exists"`
	Type   string `json:"type,omitempty"` // "file", "dir", "symlink", "other"
	Mode   uint32 `json:"mode"`           // permission bits with setuid, setgid and sticky (07777)
	Size   int64  `json:"size"`
	Nlink  uint64 `json:"nlink,omitempty"`
}

// FileRead is the reply of file read: the range [Offset, Offset+len(data))
// of the file, at most the length asked for.
type FileRead struct {
	FileInfo
	Data []byte `json:"data,omitempty"`
	// Truncated: the file has more after the range (the opposite of EOF).
	Truncated bool `json:"truncated"`
	// Bytes is the length of the data that follows the reply's line on
	// stdout (file read --raw), where Data is empty.
	Bytes int64 `json:"bytes,omitempty"`
	// Offset is where the range starts.
	Offset int64 `json:"offset"`
	// EOF: the range reaches the end of the file (an offset at or past
	// the end reads nothing, with EOF).
	EOF bool `json:"eof"`
	// SHA256 is the whole file's hash (lowercase hex), read in the same
	// pass as the range (file read --hash).
	SHA256 string `json:"sha256,omitempty"`
}

// FileWritten is the reply of file write.
type FileWritten struct {
	FileInfo
	Bytes   int64 `json:"bytes"`
	Created bool  `json:"created"`
	// Offset is where the data went: 0 for a whole-file write, the offset
	// given, or the end of the file an append wrote at.
	Offset int64 `json:"offset"`
	// Atomic: the file was replaced whole by a rename (or created by a
	// link), so no reader ever saw it half written.
	Atomic bool `json:"atomic"`
	// SHA256 is the file's hash after the write (file write --hash).
	SHA256 string `json:"sha256,omitempty"`
}

// CheckSHA256 accepts 64 hex digits and returns them in lowercase.
func CheckSHA256(s string) (string, error) {
	if len(s) != 64 {
		return "", fmt.Errorf("sha256 %q: want 64 hex digits", s)
	}
	if _, err := hex.DecodeString(s); err != nil {
		return "", fmt.Errorf("sha256 %q: want 64 hex digits", s)
	}
	return strings.ToLower(s), nil
}

// DirEntry is one entry of dir list. Nothing is followed: a symlink is
// reported with its target as data.
type DirEntry struct {
	// Path is relative to the listed directory ("a", "a/b").
	Path    string `json:"path"`
	Type    string `json:"type"` // file dir symlink fifo socket char block
	Size    int64  `json:"size"`
	Mode    uint32 `json:"mode"` // 07777 bits
	MtimeMS int64  `json:"mtime_ms"`
	UID     uint32 `json:"uid"`
	GID     uint32 `json:"gid"`
	Nlink   uint64 `json:"nlink,omitempty"`
	// Target is a symlink's target, as it is stored.
	Target string `json:"target,omitempty"`
	// Error says why a directory within the depth was not listed.
	Error string `json:"error,omitempty"`
}

// DirList is the reply of dir list.
type DirList struct {
	Path    string     `json:"path"`
	Depth   int        `json:"depth"`
	Entries []DirEntry `json:"entries"`
	// Truncated: more entries than max entries (or more names in one
	// directory than dir list reads); the listing stops there.
	Truncated bool `json:"truncated"`
}
