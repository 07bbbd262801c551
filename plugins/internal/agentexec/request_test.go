package agentexec

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
)

func TestRequest(t *testing.T) {
	good := hypervisor.ExecRequest{Argv: []string{"/bin/echo", "a b"}, Env: []string{"K=V"}, Stdin: []byte("in"), Cwd: "/tmp", MaxOutputBytes: 10}
	got, err := Request(good, time.Minute)
	want := qga.ExecRequest{Path: "/bin/echo", Args: []string{"a b"}, Env: []string{"K=V"}, Stdin: []byte("in"), Cwd: "/tmp", Timeout: time.Minute, MaxOutputBytes: 10}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("Request(%+v) = %+v, %v; want %+v", good, got, err, want)
	}
	if got, _ := Request(hypervisor.ExecRequest{Argv: []string{"true"}, Timeout: time.Second}, time.Minute); got.Timeout != time.Second {
		t.Errorf("Request(timeout 1s).Timeout = %v; want the request's own 1s", got.Timeout)
	}
	for _, bad := range []hypervisor.ExecRequest{
		{},
		{Argv: []string{""}},
		{Argv: []string{"true"}, Timeout: -time.Second},
		{Argv: []string{"true"}, MaxOutputBytes: -1},
		{Argv: []string{"true"}, Cwd: "tmp"},
		{Argv: []string{"true"}, Cwd: "../etc"},
	} {
		if _, err := Request(bad, time.Minute); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("Request(%+v) = %v; want ErrInvalidArgument", bad, err)
		}
	}
}

func TestCheckEnabled(t *testing.T) {
	cmds := func(execOn, statusOn bool) qga.Info {
		return qga.Info{SupportedCommands: []qga.Command{{Name: "guest-exec", Enabled: execOn}, {Name: "guest-exec-status", Enabled: statusOn}}}
	}
	tests := []struct {
		info qga.Info
		want string // the disabled command, "" for none
	}{
		{cmds(true, true), ""},
		{cmds(false, true), "guest-exec"},
		{cmds(true, false), "guest-exec-status"},
		{qga.Info{}, "guest-exec"},
	}
	for _, tt := range tests {
		err := CheckEnabled(tt.info)
		var cd *hypervisor.CommandDisabledError
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("CheckEnabled(%+v) = %v; want nil", tt.info, err)
		case tt.want != "" && (!errors.As(err, &cd) || cd.Command != tt.want):
			t.Errorf("CheckEnabled(%+v) = %v; want %s disabled", tt.info, err, tt.want)
		}
	}
}
