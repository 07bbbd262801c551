package consolebuf

import (
	"strings"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
)

func TestRing(t *testing.T) {
	r := New(8)
	r.Write([]byte("hello"))
	tests := []struct {
		req                    hypervisor.ConsoleReadRequest
		data                   string
		start, cursor, dropped int64
		more, reset            bool
	}{
		{hypervisor.ConsoleReadRequest{}, "hello", 0, 5, 0, false, false},
		{hypervisor.ConsoleReadRequest{Since: 2}, "llo", 2, 5, 0, false, false},
		{hypervisor.ConsoleReadRequest{Since: 5}, "", 5, 5, 0, false, false},
		{hypervisor.ConsoleReadRequest{TailBytes: 2}, "lo", 3, 5, 0, false, false},
		{hypervisor.ConsoleReadRequest{Since: 1, MaxBytes: 2}, "el", 1, 3, 0, true, false},
		{hypervisor.ConsoleReadRequest{Since: 9}, "hello", 0, 5, 0, false, true},
	}
	check := func(when string) {
		for _, tt := range tests {
			c := r.Read(tt.req)
			if string(c.Data) != tt.data || c.Start != tt.start || c.Cursor != tt.cursor || c.Dropped != tt.dropped || c.More != tt.more || c.Reset != tt.reset {
				t.Errorf("%s: Read(%+v) = %q start %d cursor %d dropped %d more %v reset %v; want %q %d %d %d %v %v",
					when, tt.req, c.Data, c.Start, c.Cursor, c.Dropped, c.More, c.Reset, tt.data, tt.start, tt.cursor, tt.dropped, tt.more, tt.reset)
			}
		}
	}
	check("before wrapping")
	// " world!" wraps: 12 bytes written, the ring keeps "o world!" (4..12).
	r.Write([]byte(" world!"))
	tests = []struct {
		req                    hypervisor.ConsoleReadRequest
		data                   string
		start, cursor, dropped int64
		more, reset            bool
	}{
		{hypervisor.ConsoleReadRequest{}, "o world!", 4, 12, 4, false, false},
		{hypervisor.ConsoleReadRequest{Since: 2}, "o world!", 4, 12, 2, false, false},
		{hypervisor.ConsoleReadRequest{Since: 6}, "world!", 6, 12, 0, false, false},
		{hypervisor.ConsoleReadRequest{TailBytes: 3}, "ld!", 9, 12, 0, false, false},
		{hypervisor.ConsoleReadRequest{TailBytes: 10}, "o world!", 4, 12, 2, false, false},
		{hypervisor.ConsoleReadRequest{Since: 3, MaxBytes: 3}, "o w", 4, 7, 1, true, false},
	}
	check("after wrapping")
	// A write larger than the ring keeps its end.
	r.Write([]byte(strings.Repeat("x", 20) + "ABCDEFGH"))
	if c := r.Read(hypervisor.ConsoleReadRequest{Since: 12}); string(c.Data) != "ABCDEFGH" || c.Start != 32 || c.Dropped != 20 || c.Cursor != 40 {
		t.Errorf("after an oversized write Read(since 12) = %q start %d dropped %d cursor %d; want ABCDEFGH 32 20 40", c.Data, c.Start, c.Dropped, c.Cursor)
	}
	if r.End() != 40 {
		t.Errorf("End() = %d; want 40", r.End())
	}
}
