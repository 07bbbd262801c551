package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/server/tools"
)

// policyPollInterval is how often serve looks for changed policy files.
const policyPollInterval = 2 * time.Second

// loadPolicies parses every grant's policy document. Any document that does
// not parse fails the whole load, naming the grant.
func loadPolicies(grants []config.Grant) (map[string]*policy.Engine, error) {
	engines := make(map[string]*policy.Engine, len(grants))
	var errs []error
	for _, g := range grants {
		name, data, err := g.PolicyDocument()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		eng, err := policy.Parse(name, data)
		if err != nil {
			errs = append(errs, fmt.Errorf("grant %s: %w", g.Name, err))
			continue
		}
		engines[g.Name] = eng
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return engines, nil
}

// warnUnknownTools logs every place eng names a tool this server does not
// have (a typo's rule never applies, so the operator must hear of it). The
// policy stays in force: `vmgate policy check --strict` is the way to make
// such a name an error before it is deployed.
func warnUnknownTools(log *slog.Logger, grant string, eng *policy.Engine) {
	for _, w := range eng.UnknownTools(tools.Names()) {
		log.Warn("vmgate: the policy names a tool this server does not have", "grant", grant, "problem", w.Error())
	}
}

// fileStamp is what a policy file change is detected by.
type fileStamp struct {
	mod  time.Time
	size int64
}

// policyReloader reloads the grants' policies on SIGHUP and when a policy
// file changes. A reload is all or nothing: when any document does not parse
// the server keeps every old policy and the reason is logged. Counters live
// in the store, so they survive a reload.
//
// A policyReloader is used by one goroutine (run); it is not safe for
// concurrent use.
type policyReloader struct {
	grants []config.Grant
	set    func(grant string, eng *policy.Engine) error
	log    *slog.Logger
	// current is the fingerprint of each grant's live document.
	current map[string]string
	// stamps are the policy files as last seen.
	stamps map[string]fileStamp
}

func newPolicyReloader(grants []config.Grant, engines map[string]*policy.Engine, set func(string, *policy.Engine) error, log *slog.Logger) *policyReloader {
	r := &policyReloader{grants: grants, set: set, log: log, current: map[string]string{}}
	for name, eng := range engines {
		r.current[name] = eng.Fingerprint()
	}
	r.stamps = r.stat()
	return r
}

// stat returns the stamps of the grants' policy files (the built-in policies
// have none). A file that cannot be read has the zero stamp, so its return
// counts as a change.
func (r *policyReloader) stat() map[string]fileStamp {
	m := make(map[string]fileStamp)
	for _, g := range r.grants {
		if _, _, builtin := config.Builtin(g.Policy); builtin {
			continue
		}
		var st fileStamp
		if fi, err := os.Stat(g.Policy); err == nil {
			st = fileStamp{fi.ModTime(), fi.Size()}
		}
		m[g.Policy] = st
	}
	return m
}

// changed reports whether a policy file changed since the last look.
func (r *policyReloader) changed() bool {
	now := r.stat()
	differ := false
	for p, st := range now {
		if r.stamps[p] != st {
			differ = true
		}
	}
	r.stamps = now
	return differ
}

// reload parses every document and swaps the engines whose document changed.
// It returns how many grants got a new policy.
func (r *policyReloader) reload(why string) (int, error) {
	engines, err := loadPolicies(r.grants)
	if err != nil {
		r.log.Error("vmgate: policy reload failed; the previous policies stay in force", "trigger", why, "err", err)
		return 0, err
	}
	swapped := 0
	for _, g := range r.grants {
		eng := engines[g.Name]
		if eng.Fingerprint() == r.current[g.Name] {
			continue
		}
		if err := r.set(g.Name, eng); err != nil {
			r.log.Error("vmgate: policy reload: cannot set policy", "grant", g.Name, "err", err)
			return swapped, err
		}
		r.current[g.Name] = eng.Fingerprint()
		swapped++
		r.log.Info("vmgate: policy reloaded", "grant", g.Name, "trigger", why, "sha256", eng.Fingerprint())
		warnUnknownTools(r.log, g.Name, eng)
	}
	return swapped, nil
}

// run reloads on every value from hup and whenever a policy file changes
// (polled every interval), until ctx ends.
func (r *policyReloader) run(ctx context.Context, hup <-chan os.Signal, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	r.loop(ctx, hup, tick.C)
}

// loop is run's body: it reloads on each signal from hup, and on each tick
// when a policy file changed, one at a time, until ctx ends.
func (r *policyReloader) loop(ctx context.Context, hup <-chan os.Signal, tick <-chan time.Time) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.changed() // a SIGHUP reload also absorbs pending file changes
			r.reload("SIGHUP")
		case <-tick:
			if r.changed() {
				r.reload("file change")
			}
		}
	}
}
