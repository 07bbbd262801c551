package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/pluginhost"
	"github.com/vmgate/vmgate/plugins/qemu"
)

// The screen row: a screenshot of a lab VM through the QEMU driver, in its
// plugin process as vmgate serve runs it (QMP connect, add-fd of a memfd,
// screendump as PNG, the PNG read back and sent over the plugin's call
// socket), against the same screendump sent straight to QMP into a file
// and read back. The vm_screenshot tool adds the gate and MCP on top; its
// row (the tool against the raw screendump) replaces this one once the
// tool exists.

func screenRow(ctx context.Context, vmgate string, warmup, pairs int) *Row {
	row := &Row{ID: "11", Unit: "ms", What: "screenshot of a lab VM (720×400 PNG): the QEMU driver's Screenshot through its plugin / screendump (format png) straight on QMP into a file, read back"}
	if withoutQEMU([]*Row{row}) {
		return row
	}
	l, err := startLab(ctx, vmgate, 1)
	defer l.stopLogged()
	if err != nil {
		row.Err = err
		return row
	}
	vm1, err := lab.Get(l.stateDir, "vm1")
	if err != nil {
		row.Err = err
		return row
	}
	h := pluginhost.New(pluginhost.Options{Registry: pluginhost.Registered(), Executable: vmgate, Logger: slog.New(slog.DiscardHandler)})
	defer h.Close()
	cfg, _ := json.Marshal(qemu.Settings{LabDir: filepath.Join(l.stateDir, "lab")})
	d, err := h.Launch(ctx, pluginhost.Spec{Driver: "qemu", Backend: "lab", Config: cfg})
	if err != nil {
		row.Err = err
		return row
	}
	sc, ok := hypervisor.AsScreener(d)
	if !ok {
		row.Err = errors.New("the QEMU plugin has no screenshots")
		return row
	}
	dir, err := os.MkdirTemp("", "vmgb-screen-")
	if err != nil {
		row.Err = err
		return row
	}
	defer os.RemoveAll(dir)
	viaDriver := func(ctx context.Context) (float64, error) {
		t0 := time.Now()
		shot, err := sc.Screenshot(ctx, "vm1", hypervisor.ScreenshotRequest{})
		el := time.Since(t0)
		if err == nil && shot.Width == 0 {
			err = errors.New("an empty screenshot")
		}
		return ms(el), err
	}
	raw := func(ctx context.Context) (float64, error) {
		return rawScreendump(ctx, vm1.QMPSocket, filepath.Join(dir, "screen.png"))
	}
	if err := Interleave(ctx, row, warmup, pairs, viaDriver, raw); err != nil {
		row.Err = err
	}
	return row
}

// rawScreendump times a screendump on a fresh QMP connection into file,
// and reading the file back, as a client of QMP itself would.
func rawScreendump(ctx context.Context, socket, file string) (float64, error) {
	t0 := time.Now()
	q, err := dialQMP(ctx, socket)
	if err != nil {
		return 0, err
	}
	defer q.c.Close()
	if _, err := q.run("screendump", map[string]any{"filename": file, "format": "png"}); err != nil {
		return 0, err
	}
	b, err := os.ReadFile(file)
	el := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if _, err := png.DecodeConfig(bytes.NewReader(b)); err != nil {
		return 0, fmt.Errorf("screendump: %w", err)
	}
	return ms(el), nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
