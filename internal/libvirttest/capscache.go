package libvirttest

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmgate/vmgate/internal/lab"
)

// libvirtd probes each QEMU binary's capabilities the first time a domain
// needs them (one QEMU run: about 5 s on an idle machine, over a minute on
// a loaded one) and caches the result in /var/cache/libvirt/qemu/
// capabilities, one XML file per binary. The private daemons start with an
// empty cache, so the entries are kept between runs beside the lab image,
// in the lab's state directory: copied in before libvirtd starts and back
// at Close. libvirtd checks every entry (QEMU's and its own binaries,
// the kernel, the CPU microcode) and probes again when one is stale, so a
// stale or damaged entry costs one probe, never a wrong answer. Entries
// reach the shared directory by rename, so two runs saving at once each
// leave a whole file.

// privateCapsDir is libvirtd's capabilities cache under Daemons.Dir.
const privateCapsDir = "cache/qemu/capabilities"

// sharedCapsDir is the shared copy, or "" when there is no state directory.
func sharedCapsDir() string {
	d, err := lab.DefaultStateDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "libvirt", "qemu-capabilities")
}

// capsEntries lists the cache entries (regular *.xml files) in dir; a
// missing dir has none.
func capsEntries(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if e.Type().IsRegular() && strings.HasSuffix(e.Name(), ".xml") {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// seedCaps copies the shared entries into the private cache under dir.
func seedCaps(shared, dir string) error {
	if shared == "" {
		return nil
	}
	names, err := capsEntries(shared)
	if err != nil || len(names) == 0 {
		return err
	}
	priv := filepath.Join(dir, privateCapsDir)
	if err := os.MkdirAll(priv, 0o755); err != nil {
		return err
	}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(shared, n))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(priv, n), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// saveCaps copies the private entries that the shared cache lacks or holds
// otherwise into it, each written to a temporary file and renamed.
func saveCaps(dir, shared string) error {
	if shared == "" {
		return nil
	}
	priv := filepath.Join(dir, privateCapsDir)
	names, err := capsEntries(priv)
	if err != nil || len(names) == 0 {
		return err
	}
	// Beside the lab image, private like it (lab.DirMode, lab.FileMode:
	// os.CreateTemp's files are 0600).
	if err := os.MkdirAll(shared, lab.DirMode); err != nil {
		return err
	}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(priv, n))
		if err != nil {
			return err
		}
		if old, err := os.ReadFile(filepath.Join(shared, n)); err == nil && bytes.Equal(old, b) {
			continue
		}
		if err := writeRenamed(filepath.Join(shared, n), b); err != nil {
			return err
		}
	}
	return nil
}

// writeRenamed writes b to a temporary file beside path and renames it there.
func writeRenamed(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".save-*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("save %s: %w", filepath.Base(path), err)
	}
	return nil
}
