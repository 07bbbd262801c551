package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// MasterName is the name the Sentinels of StartSentinel monitor the
// primary under.
const MasterName = "vmgate"

// SentinelOptions configure StartSentinel; zero values take the defaults.
type SentinelOptions struct {
	// Password is required by both Redis servers (requirepass, and
	// masterauth between them) and given to the Sentinels (auth-pass).
	Password string
	// SentinelPassword is required by the Sentinels themselves.
	SentinelPassword string
	// DownAfter is how long the primary must not answer before a Sentinel
	// thinks it down (down-after-milliseconds; default 1 s).
	DownAfter time.Duration
	// FailoverTimeout is Sentinel's failover-timeout (default 3 s).
	FailoverTimeout time.Duration
}

// Deployment is a primary, its replica and three Sentinels (quorum 2),
// each a process the test owns.
type Deployment struct {
	t    testing.TB
	opts SentinelOptions
	// Servers are the two Redis servers; Servers[0] starts as the primary.
	Servers   [2]*Server
	Sentinels [3]*Server
}

// StartSentinel starts the deployment and waits until every Sentinel knows
// the replica and the two other Sentinels, so that a failover can happen.
// t.Cleanup stops every process. Sentinels run as redis-sentinel when it
// is on PATH (Debian's package), else as redis-server --sentinel (the same
// program).
func StartSentinel(t testing.TB, o SentinelOptions) *Deployment {
	t.Helper()
	if o.DownAfter <= 0 {
		o.DownAfter = time.Second
	}
	if o.FailoverTimeout <= 0 {
		o.FailoverTimeout = 3 * time.Second
	}
	bin := serverBin(t)
	d := &Deployment{t: t, opts: o}
	d.Servers[0] = newServer(t, bin, serverArgs(o.Password), o.Password)
	d.Servers[1] = newServer(t, bin, serverArgs(o.Password, "--replicaof", "127.0.0.1", strconv.Itoa(d.Servers[0].port)), o.Password)
	if err := d.WaitInSync(d.Servers[0], d.Servers[1], 20*time.Second); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	sbin, sargs := bin, []string{"--sentinel"}
	if p, err := exec.LookPath("redis-sentinel"); err == nil {
		sbin, sargs = p, nil
	}
	for i := range d.Sentinels {
		primary := d.Servers[0].port
		s := newServer(t, sbin, func(port int, dir string) ([]string, error) {
			conf := filepath.Join(dir, "sentinel.conf")
			if err := os.WriteFile(conf, []byte(d.sentinelConf(port, dir, primary)), 0o600); err != nil {
				return nil, err
			}
			return append([]string{conf}, sargs...), nil
		}, o.SentinelPassword)
		d.Sentinels[i] = s
	}
	if err := d.waitSentinelsReady(30 * time.Second); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return d
}

// sentinelConf is one Sentinel's configuration file (Sentinel rewrites it
// as it learns the deployment, so it must be a file of its own).
func (d *Deployment) sentinelConf(port int, dir string, primary int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "port %d\nbind 127.0.0.1\ndaemonize no\ndir %q\nlogfile \"\"\nloglevel warning\n", port, dir)
	fmt.Fprintf(&b, "sentinel monitor %s 127.0.0.1 %d 2\n", MasterName, primary)
	fmt.Fprintf(&b, "sentinel down-after-milliseconds %s %d\n", MasterName, d.opts.DownAfter.Milliseconds())
	fmt.Fprintf(&b, "sentinel failover-timeout %s %d\n", MasterName, d.opts.FailoverTimeout.Milliseconds())
	fmt.Fprintf(&b, "sentinel parallel-syncs %s 1\n", MasterName)
	if d.opts.Password != "" {
		fmt.Fprintf(&b, "sentinel auth-pass %s %s\n", MasterName, d.opts.Password)
	}
	if d.opts.SentinelPassword != "" {
		fmt.Fprintf(&b, "requirepass %s\n", d.opts.SentinelPassword)
	}
	return b.String()
}

// SentinelAddrs are the Sentinels' host:port addresses.
func (d *Deployment) SentinelAddrs() []string {
	out := make([]string, len(d.Sentinels))
	for i, s := range d.Sentinels {
		out[i] = s.Addr()
	}
	return out
}

// Server returns the server at addr, nil when none of the two is there.
func (d *Deployment) Server(addr string) *Server {
	for _, s := range d.Servers {
		if s.Addr() == addr {
			return s
		}
	}
	return nil
}

// Client is a client of server s (the caller closes it), for commands a
// test sends itself.
func (d *Deployment) Client(s *Server) *goredis.Client {
	return d.client(s.Addr(), d.opts.Password)
}

func (d *Deployment) client(addr, password string) *goredis.Client {
	return goredis.NewClient(&goredis.Options{Addr: addr, Password: password, MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: time.Second, DisableIdentity: true})
}

func (d *Deployment) sentinel(s *Server) *goredis.SentinelClient {
	return goredis.NewSentinelClient(&goredis.Options{Addr: s.Addr(), Password: d.opts.SentinelPassword, MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: time.Second, DisableIdentity: true})
}

// Primary is the primary's address as every Sentinel reports it; an error
// when one does not answer or they disagree.
func (d *Deployment) Primary(ctx context.Context) (string, error) {
	var addr string
	for i, s := range d.Sentinels {
		c := d.sentinel(s)
		a, err := c.GetMasterAddrByName(ctx, MasterName).Result()
		c.Close()
		if err != nil {
			return "", fmt.Errorf("sentinel %d (%s): %w", i, s.Addr(), err)
		}
		got := strings.Join(a, ":")
		if addr != "" && got != addr {
			return "", fmt.Errorf("the sentinels disagree: %s and %s", addr, got)
		}
		addr = got
	}
	return addr, nil
}

// WaitFailover waits until every Sentinel names a primary other than old
// and that server says it is one; it returns the new primary.
func (d *Deployment) WaitFailover(old *Server, timeout time.Duration) (*Server, error) {
	var last error
	err := until(timeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		addr, err := d.Primary(ctx)
		if err != nil {
			last = err
			return err
		}
		s := d.Server(addr)
		if s == nil || s == old {
			last = fmt.Errorf("the sentinels still name %s", addr)
			return last
		}
		c := d.client(addr, d.opts.Password)
		defer c.Close()
		role, err := c.Do(ctx, "ROLE").Slice()
		if err != nil || len(role) == 0 || role[0] != "master" {
			last = fmt.Errorf("%s: ROLE = %v, %v", addr, role, err)
			return last
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("no failover away from %s within %v: %w", old.Addr(), timeout, last)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	addr, _ := d.Primary(ctx)
	return d.Server(addr), nil
}

// RestartAsReplica starts s again (it must be stopped), empty, as a
// replica of primary, the way an operator brings a lost server back, and
// waits until it is in sync.
func (d *Deployment) RestartAsReplica(s, primary *Server, timeout time.Duration) error {
	s.Stop()
	s.mu.Lock()
	s.args = serverArgs(d.opts.Password, "--replicaof", "127.0.0.1", strconv.Itoa(primary.port))
	s.mu.Unlock()
	if err := s.start(); err != nil {
		return fmt.Errorf("restart %s as a replica: %w", s.Addr(), err)
	}
	return d.WaitInSync(primary, s, timeout)
}

// WaitInSync waits until replica reports its link to primary up and has
// acknowledged everything primary holds.
func (d *Deployment) WaitInSync(primary, replica *Server, timeout time.Duration) error {
	p, r := d.client(primary.Addr(), d.opts.Password), d.client(replica.Addr(), d.opts.Password)
	defer p.Close()
	defer r.Close()
	var last error
	err := until(timeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		info, err := r.Info(ctx, "replication").Result()
		if err != nil {
			last = err
			return err
		}
		if !strings.Contains(info, "master_link_status:up") || !strings.Contains(info, "master_port:"+strconv.Itoa(primary.port)) {
			last = fmt.Errorf("replica %s: link to %s not up yet", replica.Addr(), primary.Addr())
			return last
		}
		n, err := p.Wait(ctx, 1, time.Second).Result()
		if err == nil && n < 1 {
			err = errors.New("WAIT 1 saw no acknowledgement")
		}
		last = err
		return err
	})
	if err != nil {
		return fmt.Errorf("replica %s not in sync with %s within %v: %w", replica.Addr(), primary.Addr(), timeout, last)
	}
	return nil
}

// waitSentinelsReady waits until every Sentinel knows one replica and two
// other Sentinels.
func (d *Deployment) waitSentinelsReady(timeout time.Duration) error {
	var last error
	err := until(timeout, func() error {
		for i, s := range d.Sentinels {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			c := d.sentinel(s)
			m, err := c.Master(ctx, MasterName).Result()
			c.Close()
			cancel()
			if err != nil {
				last = fmt.Errorf("sentinel %d: %w", i, err)
				return last
			}
			if m["num-slaves"] != "1" || m["num-other-sentinels"] != "2" {
				last = fmt.Errorf("sentinel %d knows %s replicas and %s other sentinels; want 1 and 2", i, m["num-slaves"], m["num-other-sentinels"])
				return last
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("the sentinels are not ready within %v: %w", timeout, last)
	}
	return nil
}

// until calls f every 50 ms until it returns nil or timeout passes.
func until(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
