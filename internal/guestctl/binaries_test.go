package guestctl

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestDefaultDirs(t *testing.T) {
	tests := []struct {
		env, exe string
		want     []string
	}{
		{"", "/usr/local/bin/vmgate", []string{"/usr/local/bin", "/usr/local/lib/vmgate"}},
		{"", "/usr/bin/vmgate", []string{"/usr/bin", "/usr/lib/vmgate"}},
		{"/opt/guest", "/src/vmgate/bin/vmgate", []string{"/opt/guest", "/src/vmgate/bin", "/src/vmgate/lib/vmgate"}},
		{"/opt/guest", "", []string{"/opt/guest"}},
		{"", "", nil},
	}
	for _, tc := range tests {
		if got := defaultDirs(tc.env, tc.exe); !slices.Equal(got, tc.want) {
			t.Errorf("defaultDirs(%q, %q) = %q; want %q", tc.env, tc.exe, got, tc.want)
		}
	}
}

// TestInstalledLayout: a vmgate installed as PREFIX/bin/vmgate finds the
// helper make install put in PREFIX/lib/vmgate.
func TestInstalledLayout(t *testing.T) {
	prefix := t.TempDir()
	lib := filepath.Join(prefix, "lib", "vmgate")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	elf := append([]byte("\x7fELF"), make([]byte, 60)...)
	if err := os.WriteFile(filepath.Join(lib, FileName("arm64")), elf, 0o755); err != nil {
		t.Fatal(err)
	}
	b := &DirBinaries{Dirs: defaultDirs("", filepath.Join(prefix, "bin", "vmgate"))}
	got, err := b.Binary("arm64")
	if err != nil || got.Source != filepath.Join(lib, FileName("arm64")) {
		t.Errorf("Binary(arm64) = %q, %v; want the build in %s", got.Source, err, lib)
	}
}
