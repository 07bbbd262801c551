package image

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
)

// ErrNoImage: no built image where one was looked for.
var ErrNoImage = errors.New("no lab image")

var hashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Open returns the built image in dir (<StateDir>/images/<hash>): its
// manifest must name the directory's hash and the kernel and initramfs
// must be there. It builds nothing.
func Open(dir string) (Image, error) {
	if !filepath.IsAbs(dir) {
		return Image{}, fmt.Errorf("image: open %q: %w: not an absolute path", dir, ErrNoImage)
	}
	m, err := ReadManifest(dir)
	if err != nil {
		return Image{}, fmt.Errorf("image: open %s: %w: %w", dir, ErrNoImage, err)
	}
	img := Image{Dir: dir, Kernel: filepath.Join(dir, KernelName), Initrd: filepath.Join(dir, InitrdName),
		Hash: m.Hash, KernelVersion: m.KernelVersion, Cached: true}
	switch {
	case !hashRE.MatchString(m.Hash) || filepath.Base(dir) != m.Hash:
		return Image{}, fmt.Errorf("image: open %s: %w: the manifest names image %q", dir, ErrNoImage, m.Hash)
	case !regular(img.Kernel) || !regular(img.Initrd):
		return Image{}, fmt.Errorf("image: open %s: %w: %s or %s is missing", dir, ErrNoImage, KernelName, InitrdName)
	}
	return img, nil
}

// Newest returns the most recently built complete image under
// <stateDir>/images (what `vmgate lab up` built last).
func Newest(stateDir string) (Image, error) {
	ents, err := os.ReadDir(filepath.Join(stateDir, "images"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return Image{}, fmt.Errorf("image: newest: %w", err)
	}
	var best Image
	var bestBuilt int64
	for _, e := range ents {
		if !e.IsDir() || !hashRE.MatchString(e.Name()) {
			continue
		}
		dir := filepath.Join(stateDir, "images", e.Name())
		img, err := Open(dir)
		if err != nil {
			continue
		}
		m, _ := ReadManifest(dir)
		if t := m.Built.UnixNano(); best.Dir == "" || t > bestBuilt {
			best, bestBuilt = img, t
		}
	}
	if best.Dir == "" {
		return Image{}, fmt.Errorf("image: newest: %w under %s (vmgate lab up builds one)", ErrNoImage, filepath.Join(stateDir, "images"))
	}
	return best, nil
}

func regular(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}
