package audit

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestLoadOrCreateKeyCreates0600(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.key")
	key, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatalf("LoadOrCreateKey = %v", err)
	}
	if len(key) != KeySize {
		t.Fatalf("key has %d bytes; want %d", len(key), KeySize)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode = %04o; want 0600", fi.Mode().Perm())
	}
	again, err := LoadOrCreateKey(path)
	if err != nil || string(again) != string(key) {
		t.Fatalf("LoadOrCreateKey(again) = %x, %v; want the same key %x", again, err, key)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries; want only the key (no temporary files left)", len(entries))
	}
}

func TestLoadOrCreateKeyConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.key")
	var wg sync.WaitGroup
	keys := make([][]byte, 8)
	errs := make([]error, 8)
	for i := range keys {
		wg.Add(1)
		go func() { defer wg.Done(); keys[i], errs[i] = LoadOrCreateKey(path) }()
	}
	wg.Wait()
	for i := range keys {
		if errs[i] != nil || string(keys[i]) != string(keys[0]) {
			t.Fatalf("LoadOrCreateKey #%d = %x, %v; want one shared key %x", i, keys[i], errs[i], keys[0])
		}
	}
}

func TestLoadKeyBadFiles(t *testing.T) {
	good := strings.Repeat("ab", KeySize)
	tests := []struct {
		name    string
		content string
		mode    os.FileMode
	}{
		{"group readable", good + "\n", 0o640},
		{"world readable", good, 0o644},
		{"too short", good[:62] + "\n", 0o600},
		{"too long", good + "00\n", 0o600},
		{"not hex", strings.Repeat("zz", KeySize), 0o600},
		{"empty", "", 0o600},
		{"trailing space instead of newline", good + " ", 0o600},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.key")
			if err := os.WriteFile(path, []byte(tt.content), tt.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, tt.mode); err != nil {
				t.Fatal(err)
			}
			if key, err := LoadKey(path); !errors.Is(err, ErrKeyFile) {
				t.Fatalf("LoadKey(%s) = %x, %v; want ErrKeyFile", tt.name, key, err)
			}
			// LoadOrCreateKey must not replace an existing bad key.
			if _, err := LoadOrCreateKey(path); !errors.Is(err, ErrKeyFile) {
				t.Fatalf("LoadOrCreateKey(%s) = %v; want ErrKeyFile", tt.name, err)
			}
			// Nor may a log open with it.
			if l, err := Open(filepath.Join(filepath.Dir(path), "audit.jsonl"), Options{}); !errors.Is(err, ErrKeyFile) {
				if l != nil {
					l.Close()
				}
				t.Fatalf("Open with key %s = %v; want ErrKeyFile", tt.name, err)
			}
		})
	}
	dir := t.TempDir()
	if _, err := LoadKey(dir); !errors.Is(err, ErrKeyFile) {
		t.Fatalf("LoadKey(directory) = %v; want ErrKeyFile", err)
	}
	good400 := filepath.Join(dir, "ro.key")
	if err := os.WriteFile(good400, []byte(good), 0o400); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKey(good400); err != nil {
		t.Fatalf("LoadKey(0400 key) = %v; want nil", err)
	}
}
