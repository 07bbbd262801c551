package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
)

// The screen row: vm_screenshot over MCP stdio against vmgate serve (the
// gate, the QEMU driver in its plugin process: QMP connect, add-fd of a
// memfd, screendump as PNG, the PNG back over the plugin's call socket and
// out as base64 image content), against the same screendump sent straight
// to QMP into a file and read back. QMP serves one client at a time, so
// each round stops the server before the raw side runs; each side's figure
// in a round is the median of screenCalls calls (the server's first call,
// which launches the plugin, is not timed).

// screenPolicy lets vm_screenshot run without a counter (the built-in
// policy's rate limit would stop the bench, not measure it).
const screenPolicy = `{"version":"1","default":"deny","tools":{"vm_screenshot":{}}}`

// screenCalls is how many calls of each side a round times.
const screenCalls = 3

func screenRow(ctx context.Context, vmgate string, warmup, pairs int) *Row {
	row := &Row{ID: "11", Unit: "ms", What: "screenshot of a lab VM (720×400 PNG), p50: vm_screenshot (MCP stdio, gate, QEMU plugin, image content) / screendump (format png) straight on QMP into a file, read back"}
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
	cfg, err := l.writePolicyConfig("screen", screenPolicy)
	if err != nil {
		row.Err = err
		return row
	}
	dir, err := os.MkdirTemp("", "vmgb-screen-")
	if err != nil {
		row.Err = err
		return row
	}
	defer os.RemoveAll(dir)
	err = Rounds(ctx, warmup, pairs, func(ctx context.Context, i int, counts bool) error {
		a, err := l.screenServerRound(ctx, cfg)
		if err != nil {
			return err
		}
		b, err := medianMs(screenCalls, func() (time.Duration, error) {
			ms, err := rawScreendump(ctx, vm1.QMPSocket, filepath.Join(dir, "screen.png"))
			return time.Duration(ms * float64(time.Millisecond)), err
		})
		if err != nil || !counts {
			return err
		}
		return row.Add(a, b)
	})
	if err != nil {
		row.Err = err
	}
	return row
}

// screenServerRound starts vmgate serve, makes one untimed screenshot and
// returns the median of screenCalls timed ones; the server is stopped
// before it returns (QMP is then free for the raw side).
func (l *labEnv) screenServerRound(ctx context.Context, cfg string) (float64, error) {
	p, err := l.serve(ctx, cfg)
	if err != nil {
		return 0, err
	}
	shot := func() (time.Duration, error) {
		t0 := time.Now()
		r, err := p.client.callTool(ctx, "vm_screenshot", `{"vm":"lab/vm1"}`)
		el := time.Since(t0)
		if err == nil {
			err = checkShot(r)
		}
		return el, err
	}
	if _, err := shot(); err != nil {
		p.kill()
		return 0, err
	}
	a, err := medianMs(screenCalls, shot)
	if err != nil {
		p.kill()
		return 0, err
	}
	return a, p.stop()
}

// checkShot: the result carries a PNG as image content.
func checkShot(r toolResult) error {
	for _, c := range r.Content {
		if c.Type != "image" {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(c.Data)
		if err != nil {
			return fmt.Errorf("vm_screenshot: image content: %w", err)
		}
		if _, err := png.DecodeConfig(bytes.NewReader(b)); err != nil {
			return fmt.Errorf("vm_screenshot: image content: %w", err)
		}
		return nil
	}
	return errors.New("vm_screenshot: no image content")
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
