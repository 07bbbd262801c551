package audit

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// KeySize is the HMAC key length in bytes.
const KeySize = 32

// DefaultKeyFile is where the key of the log at logPath lives unless
// configured otherwise: "audit.key" in the log's directory.
func DefaultKeyFile(logPath string) string {
	return filepath.Join(filepath.Dir(logPath), "audit.key")
}

// LoadKey reads a key file: a regular file with no permission bits for group
// or others (0600 or 0400), holding 64 hex digits and an optional newline.
// Anything else is an error wrapping ErrKeyFile.
func LoadKey(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("audit: load key: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("audit: load key: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("audit: load key: %s: not a regular file: %w", path, ErrKeyFile)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("audit: load key: %s: mode %04o, want 0600: %w", path, perm, ErrKeyFile)
	}
	if n := fi.Size(); n != 2*KeySize && n != 2*KeySize+1 {
		return nil, fmt.Errorf("audit: load key: %s: %d bytes, want %d hex digits: %w", path, n, 2*KeySize, ErrKeyFile)
	}
	raw, err := io.ReadAll(io.LimitReader(f, 2*KeySize+2))
	if err != nil {
		return nil, fmt.Errorf("audit: load key: %w", err)
	}
	raw = bytes.TrimSuffix(raw, []byte("\n"))
	key := make([]byte, KeySize)
	if n, err := hex.Decode(key, raw); err != nil || n != KeySize {
		return nil, fmt.Errorf("audit: load key: %s: not %d hex digits: %w", path, 2*KeySize, ErrKeyFile)
	}
	return key, nil
}

// LoadOrCreateKey loads the key file at path, creating it first (mode 0600,
// 32 random bytes, hex) when it does not exist. Creation is atomic: the key
// is written to a temporary file and linked into place, so a concurrent
// creator or a crash never leaves a half-written key; the loser of a race
// loads the winner's key.
func LoadOrCreateKey(path string) ([]byte, error) {
	key, err := LoadKey(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	if err := createKey(path); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("audit: create key: %w", err)
	}
	return LoadKey(path)
}

func createKey(path string) error {
	key := make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, ".audit-key-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	// CreateTemp makes the file 0600 already; be explicit regardless of umask.
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.WriteString(hex.EncodeToString(key) + "\n"); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
