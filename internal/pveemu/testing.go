package pveemu

import (
	"os"
	"path/filepath"
	"testing"
)

// Start starts an emulator for tb and closes it when tb ends.
func Start(tb testing.TB, opts Options) *Emulator {
	tb.Helper()
	e, err := New(opts)
	if err != nil {
		tb.Fatalf("pveemu.New: %v", err)
	}
	tb.Cleanup(func() {
		if err := e.Close(); err != nil {
			tb.Errorf("pveemu: close: %v", err)
		}
	})
	return e
}

// ClientFiles writes the server certificate (a CA file for the client) and
// secret (a token secret file, one line) into a fresh directory of tb and
// returns their paths.
func (e *Emulator) ClientFiles(tb testing.TB, secret string) (caFile, secretFile string) {
	tb.Helper()
	dir := tb.TempDir()
	caFile = filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, e.CACertPEM(), 0o600); err != nil {
		tb.Fatal(err)
	}
	secretFile = filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	return caFile, secretFile
}
