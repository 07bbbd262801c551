package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/keypace"
)

// The screen and the keyboard, through QMP alone (no guest agent):
//
//   - Screenshot: screendump with format png (QEMU 7.1 or later) into a
//     memfd the driver hands QEMU with add-fd, so QEMU writes no file by
//     name anywhere; the PNG is read back from the memfd, scaled to the
//     request's width when wider.
//   - SendKeys: one send-key per combination, keys named by their QKeyCode
//     (the key model's canonical names), paced as QEMU presses them
//     (plugins/internal/keypace).

var (
	_ hypervisor.Screener  = (*Driver)(nil)
	_ hypervisor.KeySender = (*Driver)(nil)
)

// maxScreendump bounds the PNG read back from QEMU.
const maxScreendump = 64 << 20

// fdRunner is a monitor that can pass a file descriptor with a command
// (*Monitor's RunContextFD).
type fdRunner interface {
	RunContextFD(ctx context.Context, command []byte, fd int) ([]byte, error)
}

// Screenshot captures vm's display as a PNG.
func (d *Driver) Screenshot(ctx context.Context, name string, req hypervisor.ScreenshotRequest) (hypervisor.Screenshot, error) {
	if err := req.Validate(); err != nil {
		return hypervisor.Screenshot{}, fmt.Errorf("qemu: %w", err)
	}
	vm, err := d.lookup("screenshot", name)
	if err != nil {
		return hypervisor.Screenshot{}, err
	}
	png, err := vm.screendump(ctx)
	if err != nil {
		return hypervisor.Screenshot{}, screenError(err)
	}
	shot, err := hypervisor.ScreenshotFromPNG(png, req.MaxWidth)
	if err != nil {
		return hypervisor.Screenshot{}, fmt.Errorf("qemu: %w", err)
	}
	return shot, nil
}

// screenError maps screendump's failures: a VM without a display device
// says what to add.
func screenError(err error) error {
	var qe *QMPError
	if errors.As(err, &qe) && strings.Contains(qe.Desc, "no console") {
		return fmt.Errorf("qemu: screenshot: %w: the VM has no display device (QEMU said %q): start it with one, e.g. -device VGA (with -display none and -vnc as wanted)",
			hypervisor.ErrNotSupported, qe.Desc)
	}
	if errors.As(err, &qe) && strings.Contains(qe.Desc, "format") {
		return fmt.Errorf("qemu: screenshot: %w: QEMU cannot write a PNG screendump (%q): QEMU 7.1 or later is needed", hypervisor.ErrNotSupported, qe.Desc)
	}
	return vmError("screenshot", err)
}

// screendump has QEMU write the display as a PNG into a memfd and returns
// its bytes. The memfd is passed as a write-only descriptor (screendump
// opens its file write-only, and add-fd's set must hold a descriptor of
// that access mode) and removed from QEMU's fd set afterwards.
func (vm *vmState) screendump(ctx context.Context) ([]byte, error) {
	mfd, err := unix.MemfdCreate("vmgate-screendump", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	mem := os.NewFile(uintptr(mfd), "vmgate-screendump")
	defer mem.Close()
	wr, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(mfd), os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	defer wr.Close()
	err = vm.withQMP(ctx, func(s qmpSession) error {
		fr, ok := s.m.(fdRunner)
		if !ok {
			return errors.New("this monitor cannot pass a file descriptor")
		}
		reply, err := fr.RunContextFD(ctx, []byte(`{"execute":"add-fd"}`), int(wr.Fd()))
		if err != nil {
			return err
		}
		var added struct {
			Return struct {
				FDSetID int64 `json:"fdset-id"`
			} `json:"return"`
		}
		if err := json.Unmarshal(reply, &added); err != nil {
			return fmt.Errorf("add-fd: reply %.200s: %w", reply, err)
		}
		defer s.Run("remove-fd", map[string]any{"fdset-id": added.Return.FDSetID}, nil)
		path := "/dev/fdset/" + strconv.FormatInt(added.Return.FDSetID, 10)
		return s.Run("screendump", map[string]any{"filename": path, "format": "png"}, nil)
	})
	if err != nil {
		return nil, err
	}
	return readMemfd(mem)
}

// readMemfd reads a memfd QEMU wrote, from its start, within maxScreendump.
func readMemfd(f *os.File) ([]byte, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	if fi.Size() > maxScreendump {
		return nil, fmt.Errorf("screendump of %d bytes, over the %d the driver reads", fi.Size(), maxScreendump)
	}
	b := make([]byte, fi.Size())
	if _, err := f.ReadAt(b, 0); err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	return b, nil
}

// SendKeys presses req's keys on vm's keyboard, one send-key per
// combination over one QMP connection.
func (d *Driver) SendKeys(ctx context.Context, name string, req hypervisor.KeysRequest) error {
	presses, err := req.Presses()
	if err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	vm, err := d.lookup("send keys", name)
	if err != nil {
		return err
	}
	var pace keypace.Pacer
	err = vm.withQMP(ctx, func(s qmpSession) error {
		for _, combo := range presses {
			if err := pace.Before(ctx, len(combo)); err != nil {
				return err
			}
			if err := s.Run("send-key", map[string]any{"keys": qcodes(combo)}, nil); err != nil {
				return err
			}
		}
		return pace.Drain(ctx)
	})
	if err != nil {
		return vmError("send keys", err)
	}
	return nil
}

// keyValue is QMP's KeyValue of type qcode.
type keyValue struct {
	Type string `json:"type"`
	Data string `json:"data"`
}

func qcodes(c hypervisor.KeyCombo) []keyValue {
	out := make([]keyValue, len(c))
	for i, k := range c {
		out[i] = keyValue{Type: "qcode", Data: string(k)}
	}
	return out
}
