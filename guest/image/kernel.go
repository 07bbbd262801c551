package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// KernelMetaPackage is the Debian package whose dependency names the
// versioned cloud kernel. The generic kernel boots about twice as slowly.
const KernelMetaPackage = "linux-image-cloud-amd64"

// Modules are the kernel modules /init loads, in this order: the cloud
// kernel builds virtio as modules and its .deb carries no modules.dep.
func Modules() []string {
	return []string{"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci", "virtio_console",
		"virtio_blk", "failover", "net_failover", "virtio_net"}
}

// resolveKernelPackage asks apt which versioned package the meta package
// depends on (linux-image-6.1.0-57-cloud-amd64, say).
func resolveKernelPackage(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "apt-cache", "depends", KernelMetaPackage).Output()
	if err != nil {
		return "", fmt.Errorf("apt-cache depends %s: %w", KernelMetaPackage, exitDetail(err))
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") && f[1] != KernelMetaPackage {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("apt-cache depends %s: no linux-image dependency in %q", KernelMetaPackage, out)
}

// kernelDeb returns the path of the kernel .deb in cacheDir, downloading it
// with apt-get download when it is not cached yet. When apt cannot resolve
// the package (no package lists, offline) the newest cached cloud kernel is used.
func kernelDeb(ctx context.Context, cacheDir string, progress func(string)) (pkg, debPath string, err error) {
	pkg, rerr := resolveKernelPackage(ctx)
	if rerr != nil {
		cached, _ := filepath.Glob(filepath.Join(cacheDir, "linux-image-*-cloud-amd64_*.deb"))
		if len(cached) == 0 {
			return "", "", rerr
		}
		sort.Strings(cached)
		debPath = cached[len(cached)-1]
		progress(fmt.Sprintf("apt cannot resolve the kernel (%v); using cached %s", rerr, filepath.Base(debPath)))
		return strings.SplitN(filepath.Base(debPath), "_", 2)[0], debPath, nil
	}
	if m, _ := filepath.Glob(filepath.Join(cacheDir, pkg+"_*.deb")); len(m) > 0 {
		sort.Strings(m)
		return pkg, m[len(m)-1], nil
	}
	if err := os.MkdirAll(cacheDir, dirMode); err != nil {
		return "", "", fmt.Errorf("kernel: %w", err)
	}
	tmp, err := os.MkdirTemp(cacheDir, ".download-")
	if err != nil {
		return "", "", fmt.Errorf("kernel: %w", err)
	}
	defer os.RemoveAll(tmp)
	progress("downloading " + pkg)
	cmd := exec.CommandContext(ctx, "apt-get", "download", "-q", pkg)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("apt-get download %s: %w: %s", pkg, err, bytes.TrimSpace(out))
	}
	got, _ := filepath.Glob(filepath.Join(tmp, pkg+"_*.deb"))
	if len(got) != 1 {
		return "", "", fmt.Errorf("apt-get download %s: expected one .deb, found %d", pkg, len(got))
	}
	debPath = filepath.Join(cacheDir, filepath.Base(got[0]))
	if err := os.Chmod(got[0], fileMode); err != nil { // apt-get wrote it with its umask
		return "", "", fmt.Errorf("kernel: cache %s: %w", pkg, err)
	}
	if err := os.Rename(got[0], debPath); err != nil {
		return "", "", fmt.Errorf("kernel: cache %s: %w", pkg, err)
	}
	return pkg, debPath, nil
}

// kernelFiles is what the image takes from the kernel package.
type kernelFiles struct {
	version string
	vmlinuz []byte
	modules map[string][]byte // module name → uncompressed .ko
}

// extractKernel reads the .deb's data archive (dpkg-deb --fsys-tarfile, so
// nothing is unpacked on disk) and keeps the kernel and the modules named in
// Modules, decompressing .ko.xz / .ko.zst with xz / zstd.
func extractKernel(ctx context.Context, debPath string) (kernelFiles, error) {
	kf := kernelFiles{modules: map[string][]byte{}}
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", debPath)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	r, err := cmd.StdoutPipe()
	if err != nil {
		return kf, fmt.Errorf("dpkg-deb: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return kf, fmt.Errorf("dpkg-deb: %w", err)
	}
	want := map[string]bool{}
	for _, m := range Modules() {
		want[m] = true
	}
	compressed := map[string]string{}
	tr := tar.NewReader(r)
	var rerr error
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			rerr = fmt.Errorf("read %s: %w", debPath, err)
			break
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		name := strings.TrimPrefix(h.Name, "./")
		base := path.Base(name)
		switch {
		case strings.HasPrefix(name, "boot/vmlinuz-"):
			kf.version = strings.TrimPrefix(base, "vmlinuz-")
			kf.vmlinuz, rerr = io.ReadAll(tr)
		case strings.Contains(name, "lib/modules/"):
			mod, ext := moduleName(base)
			if !want[mod] {
				continue
			}
			var b []byte
			if b, rerr = io.ReadAll(tr); rerr == nil {
				kf.modules[mod] = b
				compressed[mod] = ext
			}
		}
		if rerr != nil {
			break
		}
	}
	if rerr != nil {
		_, _ = io.Copy(io.Discard, r)
	}
	if err := cmd.Wait(); err != nil && rerr == nil {
		rerr = fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w: %s", debPath, err, bytes.TrimSpace(stderr.Bytes()))
	}
	if rerr != nil {
		return kf, rerr
	}
	if kf.vmlinuz == nil {
		return kf, fmt.Errorf("%s: no boot/vmlinuz-*", debPath)
	}
	for _, m := range Modules() {
		b, ok := kf.modules[m]
		if !ok {
			return kf, fmt.Errorf("%s: module %s not found", debPath, m)
		}
		if ext := compressed[m]; ext != "" {
			if b, err = decompress(ctx, ext, b); err != nil {
				return kf, fmt.Errorf("module %s: %w", m, err)
			}
			kf.modules[m] = b
		}
	}
	return kf, nil
}

// moduleName splits "virtio.ko.xz" into ("virtio", "xz"); ext is "" for a
// plain .ko. Names that are not modules give "".
func moduleName(base string) (mod, ext string) {
	for _, e := range []string{"", "xz", "zst"} {
		suffix := ".ko"
		if e != "" {
			suffix += "." + e
		}
		if strings.HasSuffix(base, suffix) {
			return strings.TrimSuffix(base, suffix), e
		}
	}
	return "", ""
}

// decompress runs the Debian tool for ext (xz from xz-utils, zstd from zstd).
func decompress(ctx context.Context, ext string, b []byte) ([]byte, error) {
	tool := map[string]string{"xz": "xz", "zst": "zstd"}[ext]
	if tool == "" {
		return nil, fmt.Errorf("unknown compression %q", ext)
	}
	cmd := exec.CommandContext(ctx, tool, "-dc")
	cmd.Stdin = bytes.NewReader(b)
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s -dc: %w", tool, exitDetail(err))
	}
	return out, nil
}

// exitDetail adds a command's stderr to its error.
func exitDetail(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
	}
	return err
}
