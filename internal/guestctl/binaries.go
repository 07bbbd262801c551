package guestctl

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// GuestDirEnv names a directory holding vmgate-guest-linux-<arch> builds.
const GuestDirEnv = "VMGATE_GUEST_DIR"

// ErrNoBinary: no vmgate-guest build for the guest's architecture was found.
var ErrNoBinary = errors.New("no vmgate-guest build for this architecture")

// Binary is one vmgate-guest build.
type Binary struct {
	Data   []byte
	SHA256 string // lowercase hex
	Source string // where it came from, for messages
}

// Binaries supplies vmgate-guest builds by Go architecture ("amd64", "arm64").
type Binaries interface {
	Binary(arch string) (Binary, error)
}

// FileName is the name of the build for arch: vmgate-guest-linux-<arch>.
func FileName(arch string) string { return "vmgate-guest-linux-" + arch }

// DirBinaries looks for FileName(arch) in each of Dirs, in order, and keeps
// what it read. mu guards cache. Safe for concurrent use.
type DirBinaries struct {
	Dirs []string

	mu    sync.Mutex
	cache map[string]Binary
}

// DefaultBinaries looks in $VMGATE_GUEST_DIR (when set), then beside the
// running executable (a build tree: make build puts them in bin/), then in
// ../lib/vmgate from it (where make install and the Debian package put
// them: /usr/local/bin/vmgate finds /usr/local/lib/vmgate).
func DefaultBinaries() *DirBinaries {
	exe, err := os.Executable()
	if err != nil {
		exe = ""
	}
	return &DirBinaries{Dirs: defaultDirs(os.Getenv(GuestDirEnv), exe)}
}

// defaultDirs is DefaultBinaries' search path for the guest directory
// variable's value and the executable's path ("" for none).
func defaultDirs(env, exe string) []string {
	var dirs []string
	if env != "" {
		dirs = append(dirs, env)
	}
	if exe != "" {
		bin := filepath.Dir(exe)
		dirs = append(dirs, bin, filepath.Join(filepath.Dir(bin), "lib", "vmgate"))
	}
	return dirs
}

// Binary returns the first build found for arch. It must be a Linux ELF file.
func (b *DirBinaries) Binary(arch string) (Binary, error) {
	if arch != "amd64" && arch != "arm64" {
		return Binary{}, fmt.Errorf("helper: binaries: %w: %q", ErrNoBinary, arch)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if bin, ok := b.cache[arch]; ok {
		return bin, nil
	}
	var tried []string
	for _, d := range b.Dirs {
		p := filepath.Join(d, FileName(arch))
		data, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			tried = append(tried, p)
			continue
		}
		if err != nil {
			return Binary{}, fmt.Errorf("helper: binaries: %w", err)
		}
		if !bytes.HasPrefix(data, []byte("\x7fELF")) {
			return Binary{}, fmt.Errorf("helper: binaries: %s is not an ELF executable", p)
		}
		sum := sha256.Sum256(data)
		bin := Binary{Data: data, SHA256: hex.EncodeToString(sum[:]), Source: p}
		if b.cache == nil {
			b.cache = map[string]Binary{}
		}
		b.cache[arch] = bin
		return bin, nil
	}
	return Binary{}, fmt.Errorf("helper: binaries: %w: %s not in %v (build it, or set %s)", ErrNoBinary, FileName(arch), tried, GuestDirEnv)
}
