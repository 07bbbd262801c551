package hypervisor

import (
	"context"

	pb "github.com/vmgate/vmgate/hypervisor/proto"
)

// The plugin side of Screener, KeySender, ConsoleReader and ConsoleWriter
// (screen.go): each RPC calls the driver's capability, or answers
// ErrNotSupported when it has none.

func (s *server) Screenshot(ctx context.Context, req *pb.ScreenshotRequest) (*pb.ScreenshotResponse, error) {
	sc, ok := AsScreener(s.d)
	if !ok {
		return nil, notSupported("screenshot", "screenshots")
	}
	shot, err := sc.Screenshot(ctx, req.GetVm(), ScreenshotRequest{MaxWidth: int(req.GetMaxWidth())})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.ScreenshotResponse{
		Png: shot.PNG, Width: int64(shot.Width), Height: int64(shot.Height),
		SourceWidth: int64(shot.SourceWidth), SourceHeight: int64(shot.SourceHeight),
	}, nil
}

func (s *server) SendKeys(ctx context.Context, req *pb.SendKeysRequest) (*pb.SendKeysResponse, error) {
	k, ok := AsKeySender(s.d)
	if !ok {
		return nil, notSupported("send keys", "keyboard input")
	}
	if err := k.SendKeys(ctx, req.GetVm(), keysRequestFromPB(req)); err != nil {
		return nil, toStatus(err)
	}
	return &pb.SendKeysResponse{}, nil
}

func (s *server) ConsoleRead(ctx context.Context, req *pb.ConsoleReadRequest) (*pb.ConsoleChunk, error) {
	r, ok := AsConsoleReader(s.d)
	if !ok {
		return nil, notSupported("console read", "serial console output")
	}
	c, err := r.ConsoleRead(ctx, req.GetVm(), ConsoleReadRequest{
		Since: req.GetSince(), TailBytes: int(req.GetTailBytes()), MaxBytes: int(req.GetMaxBytes()),
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.ConsoleChunk{Data: c.Data, Start: c.Start, Cursor: c.Cursor, Dropped: c.Dropped, More: c.More, Reset_: c.Reset}, nil
}

func (s *server) ConsoleWrite(ctx context.Context, req *pb.ConsoleWriteRequest) (*pb.ConsoleWriteResponse, error) {
	w, ok := AsConsoleWriter(s.d)
	if !ok {
		return nil, notSupported("console write", "serial console input")
	}
	if err := w.ConsoleWrite(ctx, req.GetVm(), req.GetData()); err != nil {
		return nil, toStatus(err)
	}
	return &pb.ConsoleWriteResponse{}, nil
}

func keysRequestToPB(vm string, r KeysRequest) *pb.SendKeysRequest {
	out := &pb.SendKeysRequest{Vm: vm, Text: r.Text, Keymap: r.Keymap, Combos: make([]*pb.KeyCombo, len(r.Combos))}
	for i, c := range r.Combos {
		keys := make([]string, len(c))
		for j, k := range c {
			keys[j] = string(k)
		}
		out.Combos[i] = &pb.KeyCombo{Keys: keys}
	}
	return out
}

func keysRequestFromPB(p *pb.SendKeysRequest) KeysRequest {
	out := KeysRequest{Text: p.GetText(), Keymap: p.GetKeymap()}
	for _, c := range p.GetCombos() {
		combo := make(KeyCombo, len(c.GetKeys()))
		for j, k := range c.GetKeys() {
			combo[j] = Key(k)
		}
		out.Combos = append(out.Combos, combo)
	}
	return out
}
