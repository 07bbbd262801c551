package redis

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/redistest"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/storetest"
)

var prefixes atomic.Int64

func openTest(t testing.TB, addr string) *Store {
	t.Helper()
	s, err := Open("redis://"+addr, Options{Prefix: fmt.Sprintf("t%d:", prefixes.Add(1)), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("Open = %v", err)
	}
	return s
}

func TestStore(t *testing.T) {
	addr, _, _ := redistest.Start(t)
	storetest.Run(t, func(t *testing.T) store.Store { return openTest(t, addr) })
}

func TestOpenBadInput(t *testing.T) {
	tests := []struct {
		url  string
		opts Options
	}{
		{"", Options{}},
		{"http://127.0.0.1:1", Options{}},
		{"redis://127.0.0.1:1", Options{Timeout: -time.Second}},
	}
	for _, tt := range tests {
		if s, err := Open(tt.url, tt.opts); !errors.Is(err, store.ErrInvalid) {
			if s != nil {
				s.Close()
			}
			t.Errorf("Open(%q, %+v) = %v; want ErrInvalid", tt.url, tt.opts, err)
		}
	}
}

// TestPrefixesAreSeparate: two prefixes on one server are two sets of budgets.
func TestPrefixesAreSeparate(t *testing.T) {
	addr, _, _ := redistest.Start(t)
	a, b := openTest(t, addr), openTest(t, addr)
	defer a.Close()
	defer b.Close()
	c := []policy.Counter{{Key: "k", Window: time.Minute, Max: 1}}
	now := storetest.T0()
	for _, s := range []*Store{a, b} {
		if err := s.ReserveAll(context.Background(), "id", now, c); err != nil {
			t.Errorf("ReserveAll under prefix %q = %v; want nil", s.prefix, err)
		}
	}
}

// TestServerDown: with Redis gone every call fails with ErrUnavailable and
// a clear reason, and works again once it is back on the same port.
func TestServerDown(t *testing.T) {
	addr, stop, restart := redistest.Start(t)
	s, err := Open("redis://"+addr, Options{Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	c := []policy.Counter{{Key: "down", Window: time.Minute, Max: 5}}
	if err := s.ReserveAll(ctx, "before", storetest.T0(), c); err != nil {
		t.Fatalf("ReserveAll before the stop = %v; want nil", err)
	}
	stop()
	calls := map[string]func() error{
		"ReserveAll": func() error { return s.ReserveAll(ctx, "during", storetest.T0(), c) },
		"Refund":     func() error { return s.Refund(ctx, "before", storetest.T0(), c) },
		"ListApprovals": func() error {
			_, err := s.ListApprovals(ctx, storetest.T0())
			return err
		},
		"ConsumeApproval": func() error {
			_, _, err := s.ConsumeApproval(ctx, "g", "t", "d", storetest.T0())
			return err
		},
	}
	for name, call := range calls {
		start := time.Now()
		err := call()
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s with Redis down = %v; want ErrUnavailable", name, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "redis: ") || !strings.Contains(msg, "store unavailable: ") {
			t.Errorf("%s with Redis down: error %q does not say what failed", name, msg)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s with Redis down took %v; want it bounded by the timeout", name, d)
		}
	}
	restart()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := s.ReserveAll(ctx, "after", storetest.T0(), c)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ReserveAll after the restart = %v; want nil within 5s", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const (
	childAddrEnv   = "VMGATE_REDIS_CHILD_ADDR"
	childPrefixEnv = "VMGATE_REDIS_CHILD_PREFIX"
)

// redisChild is the body of one of TestSeveralProcesses' processes (run
// from TestMain when childAddrEnv is set): 200 goroutines reserve one unit
// each of a max-10 counter; it prints how many it was granted.
func redisChild(addr string) error {
	s, err := Open("redis://"+addr, Options{Prefix: os.Getenv(childPrefixEnv), Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer s.Close()
	c := []policy.Counter{{Key: "shared", Window: time.Minute, Max: 10}}
	var granted, failed atomic.Int64
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			err := s.ReserveAll(context.Background(), fmt.Sprintf("%d-%d", os.Getpid(), i), storetest.T0(), c)
			var le *store.LimitedError
			switch {
			case err == nil:
				granted.Add(1)
			case !errors.As(err, &le):
				failed.Add(1)
				fmt.Fprintln(os.Stderr, err)
			}
		})
	}
	wg.Wait()
	fmt.Printf("granted %d failed %d\n", granted.Load(), failed.Load())
	return nil
}

// TestSeveralProcesses: three processes sharing one server get exactly 10
// grants together.
func TestSeveralProcesses(t *testing.T) {
	addr, _, _ := redistest.Start(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf("multi%d:", prefixes.Add(1))
	type child struct {
		cmd *exec.Cmd
		out strings.Builder
	}
	children := make([]*child, 3)
	for i := range children {
		ch := &child{cmd: exec.Command(exe)}
		ch.cmd.Env = append(os.Environ(), childAddrEnv+"="+addr, childPrefixEnv+"="+prefix)
		ch.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		ch.cmd.Stdout = &ch.out
		ch.cmd.Stderr = os.Stderr
		children[i] = ch
	}
	for _, ch := range children { // start all, then wait for all: they overlap
		if err := ch.cmd.Start(); err != nil {
			t.Fatal(err)
		}
	}
	total := 0
	for i, ch := range children {
		if err := ch.cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v; output %q", i, err, ch.out.String())
		}
		var granted, failed int
		sc := bufio.NewScanner(strings.NewReader(ch.out.String()))
		found := false
		for sc.Scan() {
			if _, err := fmt.Sscanf(sc.Text(), "granted %d failed %d", &granted, &failed); err == nil {
				found = true
			}
		}
		if !found {
			t.Fatalf("child %d printed no result: %q", i, ch.out.String())
		}
		if failed != 0 {
			t.Errorf("child %d: %d reservations failed with errors", i, failed)
		}
		t.Logf("child %d (pid %s) granted %d", i, strconv.Itoa(ch.cmd.Process.Pid), granted)
		total += granted
	}
	if total != 10 {
		t.Errorf("3 processes × 200 goroutines against max 10 were granted %d together; want 10", total)
	}
}
