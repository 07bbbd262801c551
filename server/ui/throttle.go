package ui

import (
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// Login throttling: a wrong operator token (on the login form, or as the
// bearer token of /metrics) counts against the client's address and
// against everyone. Once an address had LoginFailuresPerAddr wrong tokens
// in the last LoginWindow, or all addresses together LoginFailuresTotal,
// further attempts are refused with 429 and Retry-After before the token is
// even compared, until the oldest failure leaves the window. An IPv6
// client is counted by its /64, since one host holds all of it.
//
// The global count bounds what an attacker with many addresses can try
// (30 guesses a minute against a 256-bit token), at the price that such an
// attacker can keep the login form closed: an operator already signed in
// keeps the page, and `vmgate approvals` over the operator socket is never
// throttled.
const (
	LoginFailuresPerAddr = 5
	LoginFailuresTotal   = 30
	LoginWindow          = time.Minute
)

// loginThrottle holds the recent failures. Concurrency: mu guards all.
type loginThrottle struct {
	now   func() time.Time
	mu    sync.Mutex
	addrs map[string][]time.Time // failures within the window, oldest first
	all   []time.Time
}

func newLoginThrottle(now func() time.Time) *loginThrottle {
	return &loginThrottle{now: now, addrs: map[string][]time.Time{}}
}

// clientKey is the throttling key of a request's peer address.
func clientKey(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// prune drops the failures older than the window from ts.
func prune(ts []time.Time, now time.Time) []time.Time {
	i := 0
	for i < len(ts) && now.Sub(ts[i]) >= LoginWindow {
		i++
	}
	return ts[i:]
}

// blocked reports whether a login attempt from remote must be refused now,
// and when the next one could succeed.
func (l *loginThrottle) blocked(remote string) (time.Duration, bool) {
	key, now := clientKey(remote), l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = prune(l.all, now)
	mine := prune(l.addrs[key], now)
	if len(mine) == 0 {
		delete(l.addrs, key)
	} else {
		l.addrs[key] = mine
	}
	var wait time.Duration
	if len(mine) >= LoginFailuresPerAddr {
		wait = max(wait, mine[len(mine)-LoginFailuresPerAddr].Add(LoginWindow).Sub(now))
	}
	if len(l.all) >= LoginFailuresTotal {
		wait = max(wait, l.all[len(l.all)-LoginFailuresTotal].Add(LoginWindow).Sub(now))
	}
	return wait, wait > 0
}

// fail records a wrong token from remote.
func (l *loginThrottle) fail(remote string) {
	key, now := clientKey(remote), l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.addrs[key] = append(prune(l.addrs[key], now), now)
	l.all = append(prune(l.all, now), now)
	// Every recorded failure was admitted, so the map holds at most
	// LoginFailuresTotal addresses with failures in the window; drop
	// the others.
	if len(l.addrs) > LoginFailuresTotal {
		for k, ts := range l.addrs {
			if len(prune(ts, now)) == 0 {
				delete(l.addrs, k)
			}
		}
	}
}

// refuseThrottled answers a throttled attempt.
func refuseThrottled(w http.ResponseWriter, wait time.Duration) {
	secs := max(int64(math.Ceil(wait.Seconds())), 1)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	http.Error(w, "too many wrong operator tokens: retry in "+strconv.FormatInt(secs, 10)+" s", http.StatusTooManyRequests)
}
