package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vmgate/vmgate/internal/lab/labtest"
)

// archPolicy is the grant "arch": the directory tools within
// /tmp/vmgate-e2e-arch, and no path with "secret" in it (decided on every
// entry of an archive).
const archPolicy = `{
  "version": "1",
  "default": "deny",
  "tools": {
    "vm_dir_list": { "require": [ { "path": "args.path", "op": "regex", "value": "^/tmp/vmgate-e2e-arch(/|$)" } ], "deny_if": [ { "path": "args.path", "op": "contains", "value": "secret" } ] },
    "vm_archive_read": { "require": [ { "path": "args.path", "op": "regex", "value": "^/tmp/vmgate-e2e-arch(/|$)" } ], "deny_if": [ { "path": "args.path", "op": "contains", "value": "secret" } ] },
    "vm_archive_write": { "require": [ { "path": "args.path", "op": "regex", "value": "^/tmp/vmgate-e2e-arch(/|$)" } ], "deny_if": [ { "path": "args.path", "op": "contains", "value": "secret" } ] }
  }
}
`

// archTree is the tree archive.test.mjs moves in and out: name to content
// ("" with a trailing "/" is a directory).
func archTree(t *testing.T) map[string][]byte {
	big := make([]byte, 300<<10)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{"a.txt": []byte("alpha\n"), "sub/": nil, "sub/b.bin": big, "sub/deep/": nil, "sub/deep/c.txt": []byte("gamma\x00delta")}
}

// TestNodeSDKArchive moves a directory into the lab VM with
// vm_archive_write and back out with vm_archive_read (archive.test.mjs,
// the official SDK over stdio) and checks it byte for byte; the tar also
// holds ../vmgate-e2e-escape (refused: nothing lands outside) and
// secret.txt (the policy's), and the guest's planted secret is cut out of
// the read.
func TestNodeSDKArchive(t *testing.T) {
	labtest.RequireQEMU(t)
	node := requireNode(t)
	vm := labtest.VM(t, vmName)
	dir := t.TempDir()
	bin := buildVMGate(t, dir)
	if err := os.WriteFile(filepath.Join(dir, "arch.json"), []byte(archPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	cfg := fmt.Sprintf("state_dir: %q\ngrants:\n  - name: arch\n    policy: arch.json\n    vms: [\"lab/*\"]\nbackends:\n  - name: lab\n    driver: qemu\n    settings:\n      vms:\n        - {name: %s, qmp: %q, qga: %q}\n",
		state, vmName, vm.QMPSocket, vm.QGASocket)
	cfgPath := filepath.Join(dir, "vmgate.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	tree := archTree(t)
	in := filepath.Join(dir, "in.tar")
	if err := os.WriteFile(in, tarTree(t, tree, "secret.txt", "../vmgate-e2e-escape"), 0o600); err != nil {
		t.Fatal(err)
	}
	guestRun(t, vm, "/bin/sh", "-c", "rm -rf /tmp/vmgate-e2e-arch /tmp/vmgate-e2e-escape && mkdir -p /tmp/vmgate-e2e-arch/in && printf s > /tmp/vmgate-e2e-arch/in/secret-planted")
	defer guestRun(t, vm, "/bin/sh", "-c", "rm -rf /tmp/vmgate-e2e-arch /tmp/vmgate-e2e-escape")
	out := filepath.Join(dir, "out.tar.gz")
	runNode(t, node, append(os.Environ(), "VMGATE_BIN="+bin, "VMGATE_E2E_CONFIG="+cfgPath, "VMGATE_E2E_STATE="+state, "VMGATE_E2E_VM=lab/"+vmName,
		"VMGATE_E2E_TAR_IN="+in, "VMGATE_E2E_TAR_OUT="+out), "archive.test.mjs")

	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("archive.test.mjs wrote no tar: %v", err)
	}
	got := readTree(t, data)
	if !maps.EqualFunc(got, tree, bytes.Equal) {
		t.Errorf("the tree read back = %v; want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(tree)))
		for name, want := range tree {
			if !bytes.Equal(got[name], want) {
				t.Errorf("%s: %d bytes back; want %d, the same", name, len(got[name]), len(want))
			}
		}
	}
	if s := guestRun(t, vm, "/bin/sh", "-c", "ls /tmp/vmgate-e2e-escape /tmp/vmgate-e2e-arch/vmgate-e2e-escape /tmp/vmgate-e2e-arch/in/secret.txt 2>/dev/null; echo end"); s != "end\n" {
		t.Errorf("refused entries landed in the guest: %q", s)
	}
}

// tarTree is a tar of tree (sorted, so directories come before what is in
// them) and then one small file for each of extra.
func tarTree(t *testing.T, tree map[string][]byte, extra ...string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	write := func(name string, data []byte) {
		h := &tar.Header{Name: name, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(data))}
		if name[len(name)-1] == '/' {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(tree)) {
		write(name, tree[name])
	}
	for _, name := range extra {
		write(name, []byte("refused\n"))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// readTree is the tree in a gzip'd tar, in archTree's form.
func readTree(t *testing.T, data []byte) map[string][]byte {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("the tar read back is not gzip'd: %v", err)
	}
	tr := tar.NewReader(zr)
	out := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("the tar read back: %v", err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			name := h.Name
			if name[len(name)-1] != '/' {
				name += "/"
			}
			if name != "./" {
				out[name] = nil
			}
		case tar.TypeReg:
			b, _ := io.ReadAll(tr)
			out[h.Name] = b
		default:
			t.Errorf("unexpected entry %s of type %c", h.Name, h.Typeflag)
		}
	}
}
