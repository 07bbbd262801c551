package consolebuf

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
)

func TestReadLog(t *testing.T) {
	p := filepath.Join(t.TempDir(), "serial.log")
	if err := os.WriteFile(p, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		req  hypervisor.ConsoleReadRequest
		want hypervisor.ConsoleChunk
	}{
		{hypervisor.ConsoleReadRequest{}, hypervisor.ConsoleChunk{Data: []byte("0123456789"), Start: 0, Cursor: 10}},
		{hypervisor.ConsoleReadRequest{Since: 4}, hypervisor.ConsoleChunk{Data: []byte("456789"), Start: 4, Cursor: 10}},
		{hypervisor.ConsoleReadRequest{Since: 10}, hypervisor.ConsoleChunk{Data: []byte{}, Start: 10, Cursor: 10}},
		{hypervisor.ConsoleReadRequest{Since: 2, MaxBytes: 3}, hypervisor.ConsoleChunk{Data: []byte("234"), Start: 2, Cursor: 5, More: true}},
		{hypervisor.ConsoleReadRequest{TailBytes: 3}, hypervisor.ConsoleChunk{Data: []byte("789"), Start: 7, Cursor: 10}},
		{hypervisor.ConsoleReadRequest{TailBytes: 50}, hypervisor.ConsoleChunk{Data: []byte("0123456789"), Start: 0, Cursor: 10}},
		// A cursor past the end: QEMU started again and truncated its log.
		{hypervisor.ConsoleReadRequest{Since: 99}, hypervisor.ConsoleChunk{Data: []byte("0123456789"), Start: 0, Cursor: 10, Reset: true}},
	}
	for _, tt := range tests {
		f, err := OpenLog(p)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ReadLog(f, tt.req)
		f.Close()
		if err != nil || string(got.Data) != string(tt.want.Data) || got.Start != tt.want.Start || got.Cursor != tt.want.Cursor ||
			got.More != tt.want.More || got.Reset != tt.want.Reset || got.Dropped != 0 {
			t.Errorf("ReadLog(%+v) = %+v (%q), %v; want %+v (%q)", tt.req, got, got.Data, err, tt.want, tt.want.Data)
		}
	}
}
