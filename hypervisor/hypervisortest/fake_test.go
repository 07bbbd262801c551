package hypervisortest

import (
	"context"
	"errors"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
)

func TestFakeUnsetFailsClosed(t *testing.T) {
	f := &Fake{}
	ctx := context.Background()
	calls := []struct {
		name string
		call func() error
	}{
		{"ListVMs", func() error { _, err := f.ListVMs(ctx); return err }},
		{"Status", func() error { _, err := f.Status(ctx, "vm"); return err }},
		{"AgentInfo", func() error { _, err := f.AgentInfo(ctx, "vm"); return err }},
		{"ExecStart", func() error { _, err := f.ExecStart(ctx, "vm", hypervisor.ExecRequest{}); return err }},
		{"ExecStatus", func() error { _, err := f.ExecStatus(ctx, "vm", hypervisor.ExecHandle{}); return err }},
		{"FileRead", func() error { _, err := f.FileRead(ctx, "vm", "/p", 1); return err }},
		{"FileWrite", func() error { return f.FileWrite(ctx, "vm", "/p", nil, 0) }},
		{"Power", func() error { return f.Power(ctx, "vm", hypervisor.PowerReset) }},
		{"hypervisor.Run", func() error {
			_, err := hypervisor.Run(ctx, f, "vm", hypervisor.ExecRequest{Argv: []string{"x"}})
			return err
		}},
	}
	for _, c := range calls {
		if err := c.call(); !errors.Is(err, hypervisor.ErrNotSupported) {
			t.Errorf("unset Fake.%s() error %v; want %v", c.name, err, hypervisor.ErrNotSupported)
		}
	}
}

func TestFakeCallsItsFunctions(t *testing.T) {
	type key struct{}
	ctx := context.WithValue(context.Background(), key{}, "ctx")
	var got []string
	note := func(c context.Context, s string) {
		if c.Value(key{}) != "ctx" {
			t.Errorf("Fake passed a different context to %s", s)
		}
		got = append(got, s)
	}
	wantErr := errors.New("from the function")
	f := &Fake{
		ListVMsFunc: func(c context.Context) ([]hypervisor.VM, error) {
			note(c, "ListVMs")
			return []hypervisor.VM{{Name: "a"}}, nil
		},
		StatusFunc: func(c context.Context, vm string) (hypervisor.Status, error) {
			note(c, "Status "+vm)
			return hypervisor.Status{Name: vm}, nil
		},
		AgentInfoFunc: func(c context.Context, vm string) (hypervisor.AgentInfo, error) {
			note(c, "AgentInfo "+vm)
			return hypervisor.AgentInfo{}, wantErr
		},
		ExecStartFunc: func(c context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
			note(c, "ExecStart "+vm+" "+req.Argv[0])
			return hypervisor.ExecHandle{PID: 42}, nil
		},
		ExecStatusFunc: func(c context.Context, vm string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
			note(c, "ExecStatus "+vm)
			return hypervisor.ExecResult{PID: h.PID, Exited: true, Stdout: []byte("out")}, nil
		},
		FileReadFunc: func(c context.Context, vm, path string, maxBytes int64) (hypervisor.FileContent, error) {
			note(c, "FileRead "+vm+" "+path)
			return hypervisor.FileContent{Data: []byte("d")}, nil
		},
		FileWriteFunc: func(c context.Context, vm, path string, data []byte, mode uint32) error {
			note(c, "FileWrite "+vm+" "+path+" "+string(data))
			return nil
		},
		PowerFunc: func(c context.Context, vm string, a hypervisor.PowerAction) error {
			note(c, "Power "+vm+" "+string(a))
			return nil
		},
	}
	if vms, err := f.ListVMs(ctx); err != nil || len(vms) != 1 || vms[0].Name != "a" {
		t.Errorf("ListVMs() = %v, %v; want [a], nil", vms, err)
	}
	if st, err := f.Status(ctx, "v"); err != nil || st.Name != "v" {
		t.Errorf("Status(v) = %+v, %v; want Name v", st, err)
	}
	if _, err := f.AgentInfo(ctx, "v"); !errors.Is(err, wantErr) {
		t.Errorf("AgentInfo(v) error %v; want %v", err, wantErr)
	}
	res, err := hypervisor.Run(ctx, f, "v", hypervisor.ExecRequest{Argv: []string{"echo"}})
	if err != nil || res.PID != 42 || string(res.Stdout) != "out" {
		t.Errorf("Run(v, echo) = %+v, %v; want PID 42, stdout out", res, err)
	}
	if c, err := f.FileRead(ctx, "v", "/p", 9); err != nil || string(c.Data) != "d" {
		t.Errorf("FileRead(v, /p) = %+v, %v; want d", c, err)
	}
	if err := f.FileWrite(ctx, "v", "/p", []byte("w"), 0o600); err != nil {
		t.Errorf("FileWrite(v, /p) error %v; want nil", err)
	}
	if err := f.Power(ctx, "v", hypervisor.PowerStop); err != nil {
		t.Errorf("Power(v, stop) error %v; want nil", err)
	}
	want := []string{"ListVMs", "Status v", "AgentInfo v", "ExecStart v echo", "ExecStatus v", "FileRead v /p", "FileWrite v /p w", "Power v stop"}
	if len(got) != len(want) {
		t.Fatalf("calls = %q; want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("call %d = %q; want %q", i, got[i], want[i])
		}
	}
}
