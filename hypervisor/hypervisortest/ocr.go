package hypervisortest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os/exec"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/testload"
)

// OCR reads the text of a screenshot with tesseract (Debian's
// tesseract-ocr; scripts/deps.sh installs it). A text console's light
// letters on black are turned dark on white and enlarged three times
// first, which is what tesseract reads best.
func OCR(ctx context.Context, pngBytes []byte) (string, error) {
	bin, err := exec.LookPath("tesseract")
	if err != nil {
		return "", errors.New("ocr: tesseract not found: apt-get install tesseract-ocr (scripts/deps.sh installs it)")
	}
	img, err := png.Decode(bytes.NewReader(pngBytes))
	if err != nil {
		return "", fmt.Errorf("ocr: %w", err)
	}
	var in bytes.Buffer
	if err := png.Encode(&in, forOCR(img, 3)); err != nil {
		return "", fmt.Errorf("ocr: %w", err)
	}
	var out, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "stdin", "stdout", "--psm", "6")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = &in, &out, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("ocr: tesseract: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return out.String(), nil
}

// forOCR returns img in grey, dark text on light, enlarged by scale
// (nearest neighbour: the glyphs' pixels stay sharp).
func forOCR(img image.Image, scale int) *image.Gray {
	b := img.Bounds()
	var sum int
	grey := image.NewGray(image.Rect(0, 0, b.Dx(), b.Dy()))
	for y := range b.Dy() {
		for x := range b.Dx() {
			v := color.GrayModel.Convert(img.At(b.Min.X+x, b.Min.Y+y)).(color.Gray).Y
			grey.Pix[y*grey.Stride+x] = v
			sum += int(v)
		}
	}
	invert := sum < 128*b.Dx()*b.Dy() // mostly dark: a console
	out := image.NewGray(image.Rect(0, 0, b.Dx()*scale, b.Dy()*scale))
	for y := range out.Rect.Dy() {
		for x := range out.Rect.Dx() {
			v := grey.Pix[(y/scale)*grey.Stride+x/scale]
			if invert {
				v = 255 - v
			}
			out.Pix[y*out.Stride+x] = v
		}
	}
	return out
}

// agentName is the guest agent's process name in the lab guest (and in
// the emulators' guests, which are lab guests).
const agentName = "qemu-ga"

// StopAgentByExec is a Harness.StopAgent for guests whose agent runs
// exec: the command it starts stops the agent a second after it returns
// (SIGSTOP, which the guest's init does not answer by restarting it).
func StopAgentByExec(h Harness) func(t testing.TB) {
	return func(t testing.TB) {
		t.Helper()
		req := hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c",
			"(sleep 1; kill -STOP $(pidof " + agentName + ")) </dev/null >/dev/null 2>&1 &"}}
		res := run(t, h, req)
		wantExit0(t, req, res)
	}
}

// ResumeAgentByConsole is a Harness.ResumeAgent for drivers that write
// the serial console, where the guest has a shell: it continues the
// stopped agent and waits until Status says it answers.
func ResumeAgentByConsole(h Harness) func(t testing.TB) {
	return func(t testing.TB) {
		t.Helper()
		cw, ok := hypervisor.AsConsoleWriter(h.Driver)
		if !ok {
			t.Fatalf("ResumeAgentByConsole: the driver cannot write the console")
		}
		ctx, cancel := testload.WithTimeout(context.Background(), h.callTimeout())
		defer cancel()
		if err := cw.ConsoleWrite(ctx, h.VM, []byte("kill -CONT $(pidof "+agentName+")\n")); err != nil {
			t.Fatalf("ConsoleWrite(%q, kill -CONT) error: %v", h.VM, err)
		}
		WaitAgent(t, h)
	}
}

// WaitAgent waits until Status says h.VM's agent answers.
func WaitAgent(t testing.TB, h Harness) {
	t.Helper()
	waitFor(t, h, "the guest agent answering", func(ctx context.Context) (bool, string) {
		st, err := h.Driver.Status(ctx, h.VM)
		if err != nil {
			return false, fmt.Sprintf("Status error %v", err)
		}
		return st.AgentConnected, fmt.Sprintf("state %q, agent connected %v", st.State, st.AgentConnected)
	})
}
