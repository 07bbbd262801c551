// Package image builds the vmgate lab guest: a Debian cloud kernel and a
// gzip'd initramfs holding busybox, the host's qemu-ga with its libraries,
// the virtio modules and a small /init, plus any extra files the caller
// ships (the vmgate-guest helper, later).
//
// Everything comes from Debian packages: the kernel from
// linux-image-cloud-amd64 (fetched with apt-get download, read with
// dpkg-deb, never installed), busybox from busybox-static, qemu-ga from
// qemu-guest-agent. Images are cached under <StateDir>/images/<hash>/ where
// hash is the SHA-256 of every input (file contents, guest paths, modes,
// the recipe version); a second Build with the same inputs does no work.
// What Build writes there (and in the package cache) is its user's alone:
// directories 0700, files 0600, as everything in the state directory.
//
// Build is safe to call from several processes at once: each builds into
// its own temporary directory and renames it into place; the first rename
// wins and the others use its result.
package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// recipeVersion changes whenever the layout of the image changes, so older
// cached images are not reused.
const recipeVersion = "vmgate-lab-image/1"

//go:embed rootfs/init
var initScript []byte

//go:embed rootfs/shutdown
var shutdownScript []byte

// nohupScript stands in for the nohup applet Debian's busybox-static
// lacks.
//
//go:embed rootfs/nohup
var nohupScript []byte

// dirMode and fileMode are the modes of what Build writes under the state
// directory, which only vmgate's own user may read (internal/lab's
// DirMode and FileMode, which this package cannot import).
const (
	dirMode  = 0o700
	fileMode = 0o600
)

// ErrInvalidOptions is wrapped by every error about bad Options.
var ErrInvalidOptions = errors.New("invalid image options")

// File is an extra host file shipped in the initramfs.
type File struct {
	// Src is the host file (absolute path to a regular file).
	Src string
	// Dst is the absolute path in the guest, e.g. /usr/bin/vmgate-guest.
	Dst string
	// Mode is the guest permission bits (at most 0o7777); 0 takes the host file's.
	Mode fs.FileMode
}

// Options configure Build.
type Options struct {
	// StateDir is vmgate's state directory (required); the image goes to
	// <StateDir>/images/<hash>/.
	StateDir string
	// CacheDir holds downloaded packages; empty means <StateDir>/cache.
	CacheDir string
	// Extra files go into the initramfs and into the hash.
	Extra []File
	// Progress, when set, receives one line per build step.
	Progress func(step string)
}

// Image is a built lab guest.
type Image struct {
	Dir    string // <StateDir>/images/<Hash>
	Kernel string // path of vmlinuz
	Initrd string // path of initrd.img
	Hash   string // hex SHA-256 of the inputs
	// KernelVersion is the kernel release, e.g. 6.1.0-57-cloud-amd64.
	KernelVersion string
	// Cached is true when Build found the image already built.
	Cached bool
}

// Manifest is written as manifest.json next to the kernel and initrd.
type Manifest struct {
	Hash          string          `json:"hash"`
	Recipe        string          `json:"recipe"`
	KernelPackage string          `json:"kernel_package"`
	KernelDeb     string          `json:"kernel_deb_sha256"`
	KernelVersion string          `json:"kernel_version"`
	Modules       []string        `json:"modules"`
	Built         time.Time       `json:"built"`
	Files         []ManifestEntry `json:"files"`
}

// ManifestEntry is one initramfs entry.
type ManifestEntry struct {
	Path   string `json:"path"`             // absolute guest path
	Type   string `json:"type"`             // file, dir, symlink, chardev
	Mode   string `json:"mode"`             // octal permission bits
	Size   int    `json:"size,omitempty"`   // file size
	SHA256 string `json:"sha256,omitempty"` // file content
	Target string `json:"target,omitempty"` // symlink target or "major:minor"
	Source string `json:"source,omitempty"` // host origin
}

// ManifestName, KernelName and InitrdName are the file names in an image directory.
const (
	ManifestName = "manifest.json"
	KernelName   = "vmlinuz"
	InitrdName   = "initrd.img"
)

// entry is one initramfs entry being assembled.
type entry struct {
	typ        uint32 // cpioType*
	perm       uint32
	data       []byte
	target     string // symlink
	rmaj, rmin uint32 // char device
	source     string
}

// Build returns the lab image for opts, building it when it is not cached.
func Build(ctx context.Context, opts Options) (Image, error) {
	progress := opts.Progress
	if progress == nil {
		progress = func(string) {}
	}
	if err := validate(opts); err != nil {
		return Image{}, fmt.Errorf("image: build: %w", err)
	}
	cacheDir := opts.CacheDir
	if cacheDir == "" {
		cacheDir = filepath.Join(opts.StateDir, "cache")
	}

	// Gather the host inputs before anything is written.
	tree := map[string]*entry{}
	if err := hostInputs(ctx, tree, opts.Extra); err != nil {
		return Image{}, fmt.Errorf("image: build: %w", err)
	}
	pkg, deb, err := kernelDeb(ctx, cacheDir, progress)
	if err != nil {
		return Image{}, fmt.Errorf("image: build: %w", err)
	}
	debSum, err := fileSHA256(deb)
	if err != nil {
		return Image{}, fmt.Errorf("image: build: %w", err)
	}
	hash := inputHash(debSum, tree)
	dir := filepath.Join(opts.StateDir, "images", hash)
	img := Image{Dir: dir, Kernel: filepath.Join(dir, KernelName), Initrd: filepath.Join(dir, InitrdName), Hash: hash}
	if m, err := ReadManifest(dir); err == nil && m.Hash == hash && exists(img.Kernel) && exists(img.Initrd) {
		img.KernelVersion, img.Cached = m.KernelVersion, true
		progress("image " + hash[:12] + " is cached")
		return img, nil
	}

	progress("extracting kernel from " + filepath.Base(deb))
	kf, err := extractKernel(ctx, deb)
	if err != nil {
		return Image{}, fmt.Errorf("image: build: %w", err)
	}
	img.KernelVersion = kf.version
	for _, m := range Modules() {
		tree["/lib/modules/"+m+".ko"] = &entry{typ: cpioTypeFile, perm: 0o644, data: kf.modules[m], source: filepath.Base(deb)}
	}
	addParents(tree)

	progress("writing initramfs")
	if err := os.MkdirAll(filepath.Dir(dir), dirMode); err != nil {
		return Image{}, fmt.Errorf("image: build: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".build-")
	if err != nil {
		return Image{}, fmt.Errorf("image: build: %w", err)
	}
	defer os.RemoveAll(tmp)
	man := Manifest{Hash: hash, Recipe: recipeVersion, KernelPackage: pkg, KernelDeb: debSum,
		KernelVersion: kf.version, Modules: Modules(), Built: time.Now().UTC(), Files: manifestEntries(tree)}
	if err := writeImage(tmp, tree, kf.vmlinuz, man); err != nil {
		return Image{}, fmt.Errorf("image: build: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Another builder won the race: use its image if it is complete.
		if m, merr := ReadManifest(dir); merr == nil && m.Hash == hash {
			img.Cached = true
			return img, nil
		}
		return Image{}, fmt.Errorf("image: build: install %s: %w", dir, err)
	}
	progress("image " + hash[:12] + " built (kernel " + kf.version + ")")
	return img, nil
}

// writeImage writes the image into dir (a new directory, installed by a
// rename once it is complete): the initramfs of tree, the kernel and the
// manifest man.
func writeImage(dir string, tree map[string]*entry, vmlinuz []byte, man Manifest) error {
	if err := writeInitrd(filepath.Join(dir, InitrdName), tree); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, KernelName), vmlinuz, fileMode); err != nil {
		return err
	}
	mb, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, ManifestName), append(mb, '\n'), fileMode); err != nil {
		return err
	}
	return os.Chmod(dir, dirMode)
}

// ReadManifest reads dir/manifest.json.
func ReadManifest(dir string) (Manifest, error) {
	var m Manifest
	b, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		return m, fmt.Errorf("image: manifest: %w", err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("image: manifest: %s: %w", dir, err)
	}
	return m, nil
}

// validate checks opts without touching anything.
func validate(opts Options) error {
	if opts.StateDir == "" {
		return fmt.Errorf("%w: empty state directory", ErrInvalidOptions)
	}
	seen := map[string]bool{}
	for i, f := range opts.Extra {
		if !filepath.IsAbs(f.Src) {
			return fmt.Errorf("%w: extra[%d]: source %q is not an absolute path", ErrInvalidOptions, i, f.Src)
		}
		if !path.IsAbs(f.Dst) || path.Clean(f.Dst) != f.Dst || f.Dst == "/" || strings.ContainsAny(f.Dst, "\x00\n") {
			return fmt.Errorf("%w: extra[%d]: guest path %q is not a clean absolute path", ErrInvalidOptions, i, f.Dst)
		}
		if reservedPath(f.Dst) {
			return fmt.Errorf("%w: extra[%d]: guest path %q belongs to the base image", ErrInvalidOptions, i, f.Dst)
		}
		if seen[f.Dst] {
			return fmt.Errorf("%w: extra[%d]: guest path %q given twice", ErrInvalidOptions, i, f.Dst)
		}
		seen[f.Dst] = true
		if f.Mode&^0o7777 != 0 {
			return fmt.Errorf("%w: extra[%d]: mode %v has bits beyond 0o7777", ErrInvalidOptions, i, f.Mode)
		}
		st, err := os.Stat(f.Src)
		if err != nil {
			return fmt.Errorf("%w: extra[%d]: %w", ErrInvalidOptions, i, err)
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("%w: extra[%d]: %s is not a regular file", ErrInvalidOptions, i, f.Src)
		}
	}
	return nil
}

// reservedPath reports whether p is (or is under) a path the base image
// owns or the guest mounts over.
func reservedPath(p string) bool {
	for _, r := range []string{"/init", "/sbin/shutdown", "/usr/bin/nohup", "/bin/busybox", "/usr/bin/qemu-ga", "/lib/modules", "/lib64",
		"/lib/x86_64-linux-gnu", "/proc", "/sys", "/dev", "/tmp", "/run", "/var/lib", "/etc/passwd", "/etc/group"} {
		if p == r || strings.HasPrefix(p, r+"/") {
			return true
		}
	}
	return false
}

// hostInputs fills tree with everything but the kernel modules.
func hostInputs(ctx context.Context, tree map[string]*entry, extra []File) error {
	for _, d := range []string{"/proc", "/sys", "/dev", "/tmp", "/run", "/var/lib", "/root", "/etc", "/mnt", "/home", "/usr/sbin", "/usr/bin", "/sbin", "/bin", "/lib/modules"} {
		tree[d] = &entry{typ: cpioTypeDir, perm: 0o755}
	}
	tree["/tmp"].perm = 0o1777
	tree["/root"].perm = 0o700
	tree["/var/run"] = &entry{typ: cpioTypeSymlink, perm: 0o777, target: "/run"}
	tree["/dev/console"] = &entry{typ: cpioTypeChar, perm: 0o600, rmaj: 5, rmin: 1}
	tree["/dev/null"] = &entry{typ: cpioTypeChar, perm: 0o666, rmaj: 1, rmin: 3}
	tree["/init"] = &entry{typ: cpioTypeFile, perm: 0o755, data: initScript, source: "embedded rootfs/init"}
	tree["/sbin/shutdown"] = &entry{typ: cpioTypeFile, perm: 0o755, data: shutdownScript, source: "embedded rootfs/shutdown"}
	tree["/usr/bin/nohup"] = &entry{typ: cpioTypeFile, perm: 0o755, data: nohupScript, source: "embedded rootfs/nohup"}
	tree["/etc/passwd"] = &entry{typ: cpioTypeFile, perm: 0o644, data: []byte("root:x:0:0:root:/root:/bin/sh\n"), source: "generated"}
	tree["/etc/group"] = &entry{typ: cpioTypeFile, perm: 0o644, data: []byte("root:x:0:\n"), source: "generated"}
	tree["/etc/hostname"] = &entry{typ: cpioTypeFile, perm: 0o644, data: []byte("vmgate-lab\n"), source: "generated"}

	if err := addBusybox(ctx, tree); err != nil {
		return err
	}

	// qemu-ga with every library ldd names and the loader.
	qga, err := lookPath("qemu-ga")
	if err != nil {
		return err
	}
	if err := addFile(tree, "/usr/bin/qemu-ga", qga, 0o755); err != nil {
		return err
	}
	libs, err := sharedLibs(ctx, qga)
	if err != nil {
		return err
	}
	for _, l := range libs {
		if err := addFile(tree, l, l, 0o755); err != nil {
			return err
		}
	}

	for _, f := range extra {
		mode := uint32(f.Mode)
		if mode == 0 {
			st, err := os.Stat(f.Src)
			if err != nil {
				return fmt.Errorf("extra %s: %w", f.Src, err)
			}
			mode = uint32(st.Mode().Perm())
		}
		if err := addFile(tree, f.Dst, f.Src, mode); err != nil {
			return err
		}
	}
	addParents(tree)
	return nil
}

func addFile(tree map[string]*entry, guest, host string, perm uint32) error {
	b, err := os.ReadFile(host)
	if err != nil {
		return fmt.Errorf("read %s: %w", host, err)
	}
	tree[guest] = &entry{typ: cpioTypeFile, perm: perm, data: b, source: host}
	return nil
}

// addParents adds the missing parent directories of every entry.
func addParents(tree map[string]*entry) {
	for p := range tree {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := tree[d]; !ok {
				tree[d] = &entry{typ: cpioTypeDir, perm: 0o755}
			}
		}
	}
}

// lookPath finds a host tool on PATH, then in the sbin directories a
// non-root PATH often lacks (qemu-ga lives in sbin on Debian).
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return filepath.EvalSymlinks(p)
	}
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found on PATH (install the Debian package that provides it)", name)
}

// sharedLibs lists the absolute library paths ldd prints for bin, the loader included.
func sharedLibs(ctx context.Context, bin string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ldd", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", bin, exitDetail(err))
	}
	var libs []string
	for _, l := range strings.Split(string(out), "\n") {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		if strings.Contains(l, "not found") {
			return nil, fmt.Errorf("ldd %s: %s", bin, l)
		}
		f := strings.Fields(l)
		var p string
		switch {
		case len(f) >= 3 && f[1] == "=>":
			p = f[2]
		case len(f) >= 1:
			p = f[0]
		}
		if strings.HasPrefix(p, "/") {
			libs = append(libs, filepath.Clean(p))
		}
	}
	if len(libs) == 0 {
		return nil, fmt.Errorf("ldd %s: no libraries listed", bin)
	}
	return libs, nil
}

// inputHash is the SHA-256 of the recipe, the kernel package and every
// entry's path, type, mode and content.
func inputHash(debSum string, tree map[string]*entry) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\nkernel-deb %s\nmodules %s\n", recipeVersion, debSum, strings.Join(Modules(), ","))
	for _, p := range sortedPaths(tree) {
		e := tree[p]
		sum := sha256.Sum256(e.data)
		fmt.Fprintf(h, "%q %o %o %x %q %d:%d\n", p, e.typ, e.perm, sum, e.target, e.rmaj, e.rmin)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func sortedPaths(tree map[string]*entry) []string {
	ps := make([]string, 0, len(tree))
	for p := range tree {
		ps = append(ps, p)
	}
	sort.Strings(ps)
	return ps
}

// writeInitrd writes the tree as a gzip'd newc cpio archive. Parents sort
// before their children, so the kernel can create every entry in order.
func writeInitrd(file string, tree map[string]*entry) error {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if err != nil {
		return err
	}
	cw := &cpioWriter{w: zw}
	for _, p := range sortedPaths(tree) {
		e := tree[p]
		name := strings.TrimPrefix(p, "/")
		switch e.typ {
		case cpioTypeSymlink:
			err = cw.writeEntry(name, e.typ|e.perm, []byte(e.target), 0, 0)
		case cpioTypeChar:
			err = cw.writeEntry(name, e.typ|e.perm, nil, e.rmaj, e.rmin)
		default:
			err = cw.writeEntry(name, e.typ|e.perm, e.data, 0, 0)
		}
		if err != nil {
			return err
		}
	}
	if err := cw.close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("gzip: %w", err)
	}
	return os.WriteFile(file, buf.Bytes(), fileMode)
}

func manifestEntries(tree map[string]*entry) []ManifestEntry {
	var out []ManifestEntry
	for _, p := range sortedPaths(tree) {
		e := tree[p]
		me := ManifestEntry{Path: p, Mode: fmt.Sprintf("%04o", e.perm), Source: e.source}
		switch e.typ {
		case cpioTypeDir:
			me.Type = "dir"
		case cpioTypeSymlink:
			me.Type, me.Target = "symlink", e.target
		case cpioTypeChar:
			me.Type, me.Target = "chardev", fmt.Sprintf("%d:%d", e.rmaj, e.rmin)
		default:
			me.Type, me.Size = "file", len(e.data)
			sum := sha256.Sum256(e.data)
			me.SHA256 = hex.EncodeToString(sum[:])
		}
		out = append(out, me)
	}
	return out
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
