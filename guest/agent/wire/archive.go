package wire

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
)

// Archives: archive read makes a tar (gzip optional) of a directory tree;
// archive write extracts one into a directory. ScanArchive is the one tar
// reader both sides use, so the entry paths the host asks its policy about
// (ListArchive) are the paths the guest writes (ArchiveWritten.Entries).

// ArchiveLimits bound an archive: the content of its regular files
// together, and its entries (of any kind, refused ones included).
type ArchiveLimits struct {
	MaxBytes   int64 `json:"max_bytes"`
	MaxEntries int   `json:"max_entries"`
}

// WithDefaults fills zero limits with the defaults.
func (l ArchiveLimits) WithDefaults() ArchiveLimits {
	if l.MaxBytes == 0 {
		l.MaxBytes = DefaultArchiveBytes
	}
	if l.MaxEntries == 0 {
		l.MaxEntries = DefaultArchiveEntries
	}
	return l
}

// Validate checks the limits' ranges (after WithDefaults).
func (l ArchiveLimits) Validate() error {
	if l.MaxBytes < 1 || l.MaxBytes > MaxArchiveBytes {
		return fmt.Errorf("max_bytes %d out of range 1..%d", l.MaxBytes, int64(MaxArchiveBytes))
	}
	if l.MaxEntries < 1 || l.MaxEntries > MaxArchiveEntries {
		return fmt.Errorf("max_entries %d out of range 1..%d", l.MaxEntries, MaxArchiveEntries)
	}
	return nil
}

// Archive entry actions (ArchiveEntry.Action).
const (
	ActionCreate  = "create"  // a new entry
	ActionReplace = "replace" // a regular file or symlink that was there, replaced whole
	ActionExists  = "exists"  // a directory that was there already, kept as it is
	ActionRefused = "refused" // nothing written (Reason, Message say why)
)

// ArchiveEntry is one entry of an archive write: what was done, or with
// --dry-run what would be.
type ArchiveEntry struct {
	Index int    `json:"index"` // its position in the archive, from 0
	Name  string `json:"name"`  // as the archive has it
	// Path is where it goes: the target joined with the cleaned name; ""
	// when the name itself is refused (absolute, "..", NUL).
	Path string `json:"path,omitempty"`
	Type string `json:"type"` // file dir symlink hardlink char block fifo other
	Size int64  `json:"size,omitempty"`
	Mode uint32 `json:"mode"`
	// Link is a symlink's target or a hard link's source name.
	Link    string `json:"link,omitempty"`
	Action  string `json:"action,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// ArchiveWritten is the reply of archive write.
type ArchiveWritten struct {
	Path    string         `json:"path"`
	Entries []ArchiveEntry `json:"entries"`
	Written int            `json:"written"`
	Refused int            `json:"refused"`
	// Bytes is the content of the regular files written.
	Bytes  int64 `json:"bytes"`
	DryRun bool  `json:"dry_run,omitempty"`
	// Aborted: --all-or-nothing and an entry was refused, so nothing was written.
	Aborted bool `json:"aborted,omitempty"`
}

// ArchiveSkip is an entry archive read left out, and why.
type ArchiveSkip struct {
	Path   string `json:"path"`
	Type   string `json:"type"`
	Reason string `json:"reason"`
}

// ArchiveRead is the reply of archive read; the tar is the command's data.
type ArchiveRead struct {
	Path    string `json:"path"`
	Entries int    `json:"entries"`
	// Bytes is the content of the regular files archived.
	Bytes int64 `json:"bytes"`
	Gzip  bool  `json:"gzip"`
	// Skipped: devices, FIFOs, sockets, and what could not be read (the
	// first MaxSkipped; SkippedMore counts the rest).
	Skipped     []ArchiveSkip `json:"skipped,omitempty"`
	SkippedMore int           `json:"skipped_more,omitempty"`
	// Changed: files whose size changed while they were read (archived
	// cut or padded with zeros to the size they had when listed).
	Changed []string `json:"changed,omitempty"`
}

// MaxSkipped bounds ArchiveRead.Skipped.
const MaxSkipped = 1000

// ErrArchiveLimit: the archive has more entries or content than its limits.
var ErrArchiveLimit = errors.New("archive over its limits")

// ErrArchiveFormat: the data is not a readable tar (gzip'd or not).
var ErrArchiveFormat = errors.New("not a readable tar archive")

// ArchiveHeader is one entry as ScanArchive passes it on.
type ArchiveHeader struct {
	Index  int
	Header *tar.Header
	Type   string // ArchiveType of the header
	// Name is the cleaned name relative to the target ("" for the target
	// itself), valid when NameReason is "".
	Name                    string
	NameReason, NameMessage string
}

// headerAllowance is the tar stream a well-formed entry carries besides its
// content (header blocks, a long name, padding); beyond that per entry
// plus pathAllowance, decompressing stops (a gzip bomb of headers).
const (
	headerAllowance = 8 << 10
	pathAllowance   = 1 << 20
)

// ScanArchive reads the tar on r (gzip'd when it starts with gzip's magic
// bytes) and calls fn for each entry in order; fn may read the entry's
// content from body. It stops with ErrArchiveLimit before the entry that
// goes past lim, or when the decompressed stream grows past the content
// plus a few KiB per entry, and with ErrArchiveFormat on a malformed tar.
// It reports whether the data was gzip'd.
func ScanArchive(r io.Reader, lim ArchiveLimits, fn func(h ArchiveHeader, body io.Reader) error) (gzipped bool, err error) {
	lim = lim.WithDefaults()
	br := bufio.NewReaderSize(r, 64<<10)
	var src io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return true, fmt.Errorf("%w: gzip: %v", ErrArchiveFormat, err)
		}
		defer zr.Close()
		src, gzipped = zr, true
	}
	cr := &countingReader{r: src}
	tr := tar.NewReader(cr)
	var content int64
	for i := 0; ; i++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return gzipped, nil
		}
		if err != nil {
			return gzipped, fmt.Errorf("%w: entry %d: %v", ErrArchiveFormat, i, err)
		}
		if i >= lim.MaxEntries {
			return gzipped, fmt.Errorf("%w: more than %d entries", ErrArchiveLimit, lim.MaxEntries)
		}
		typ := ArchiveType(hdr.Typeflag)
		if hdr.Size < 0 {
			return gzipped, fmt.Errorf("%w: entry %d (%q): negative size", ErrArchiveFormat, i, hdr.Name)
		}
		if typ == "file" {
			content += hdr.Size
			if content > lim.MaxBytes {
				return gzipped, fmt.Errorf("%w: entry %d (%q, %d bytes) takes the content past max_bytes %d", ErrArchiveLimit, i, hdr.Name, hdr.Size, lim.MaxBytes)
			}
		}
		if cr.n > content+int64(i+1)*headerAllowance+pathAllowance {
			return gzipped, fmt.Errorf("%w: %d bytes of tar stream for %d bytes of content in %d entries", ErrArchiveLimit, cr.n, content, i+1)
		}
		h := ArchiveHeader{Index: i, Header: hdr, Type: typ}
		h.Name, h.NameReason, h.NameMessage = CleanArchiveName(hdr.Name)
		if err := fn(h, tr); err != nil {
			return gzipped, err
		}
	}
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// ArchiveType names a tar type flag: file dir symlink hardlink char block
// fifo, or other.
func ArchiveType(flag byte) string {
	switch flag {
	case tar.TypeReg, '\x00', tar.TypeCont, tar.TypeGNUSparse:
		return "file"
	case tar.TypeDir:
		return "dir"
	case tar.TypeSymlink:
		return "symlink"
	case tar.TypeLink:
		return "hardlink"
	case tar.TypeChar:
		return "char"
	case tar.TypeBlock:
		return "block"
	case tar.TypeFifo:
		return "fifo"
	}
	return "other"
}

// CleanArchiveName is name relative to the target, cleaned ("./a/b/" is
// "a/b"; "." and "./" are "", the target itself), or a refusal reason and
// message for a name that is empty, holds NUL, is absolute, has a ".."
// component anywhere, or is longer than 4096 bytes.
func CleanArchiveName(name string) (clean, reason, message string) {
	switch {
	case name == "":
		return "", ReasonOutside, "empty name"
	case strings.IndexByte(name, 0) >= 0:
		return "", ReasonOutside, "name contains NUL"
	case len(name) > 4096:
		return "", ReasonOutside, fmt.Sprintf("name is %d bytes; the limit is 4096", len(name))
	case strings.HasPrefix(name, "/"):
		return "", ReasonOutside, "absolute name"
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", ReasonOutside, `name has a ".." component`
		}
	}
	clean = path.Clean(name)
	if clean == "." {
		clean = ""
	}
	return clean, "", ""
}

// ArchivePath is where an entry with the cleaned name goes in target (an
// absolute, clean path).
func ArchivePath(target, clean string) string {
	if clean == "" {
		return target
	}
	return path.Join(target, clean)
}

// SymlinkInside reports whether a symlink named clean (relative to the
// target) with this target string stays inside the target directory,
// resolved by its text alone: relative, and no ".." climbing above the
// target.
func SymlinkInside(clean, target string) bool {
	if target == "" || path.IsAbs(target) || strings.IndexByte(target, 0) >= 0 {
		return false
	}
	r := path.Join(path.Dir(clean), target)
	return r != ".." && !strings.HasPrefix(r, "../")
}

// ListArchive lists the entries of the tar on r as archive write into
// target would see them: index, name, the path each goes to (what a policy
// decides on), type, size, mode and link, with Action "refused" only for
// names that leave the target. It reads the content through, within lim.
func ListArchive(r io.Reader, target string, lim ArchiveLimits) ([]ArchiveEntry, error) {
	var out []ArchiveEntry
	_, err := ScanArchive(r, lim, func(h ArchiveHeader, _ io.Reader) error {
		e := EntryOf(h, target)
		out = append(out, e)
		return nil
	})
	return out, err
}

// EntryOf is the ArchiveEntry of a scanned header, before any check but
// the name's.
func EntryOf(h ArchiveHeader, target string) ArchiveEntry {
	e := ArchiveEntry{Index: h.Index, Name: h.Header.Name, Type: h.Type, Mode: uint32(h.Header.Mode) & 0o7777, Link: h.Header.Linkname}
	if h.Type == "file" {
		e.Size = h.Header.Size
	}
	if h.NameReason != "" {
		e.Action, e.Reason, e.Message = ActionRefused, h.NameReason, h.NameMessage
		return e
	}
	e.Path = ArchivePath(target, h.Name)
	return e
}
