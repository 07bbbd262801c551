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
// bearer token of /metrics) counts against the client's address (an IPv6
// client by its /64, since one host holds all of it) and against everyone.
//
//   - An address that sent LoginFailuresPerAddr wrong tokens in the last
//     LoginWindow is refused with 429 and Retry-After before its token is
//     even compared, until its oldest failure leaves the window.
//   - The count of all addresses together never refuses the right token:
//     the token is compared first (in constant time), the right one passes,
//     and only a wrong one beyond LoginFailuresTotal in the window is
//     answered 429 with Retry-After instead of 401 (and logged once a
//     window instead of one by one).
//
// So wrong tokens from many addresses cannot lock the operator out of /ui
// or /metrics; each address gets LoginFailuresPerAddr guesses a minute
// against a 256-bit token. The failures kept are bounded: the last few
// per address, for at most maxThrottledAddrs addresses, and the last
// LoginFailuresTotal of all. `vmgate approvals` over the operator socket
// is never throttled.
const (
	LoginFailuresPerAddr = 5
	LoginFailuresTotal   = 30
	LoginWindow          = time.Minute
)

// maxThrottledAddrs bounds the addresses whose failures are kept; past it,
// those whose failures left the window are dropped, then others (an
// attacker with that many addresses gains little: the right token is
// 256 bits).
const maxThrottledAddrs = 4096

// loginThrottle holds the recent failures. Concurrency: mu guards all.
type loginThrottle struct {
	now    func() time.Time
	mu     sync.Mutex
	addrs  map[string][]time.Time // each address's last failures within the window, oldest first
	all    []time.Time            // the last LoginFailuresTotal failures of all, oldest first
	logged time.Time              // when the last failure over the total was logged
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

// over returns how long until ts (oldest first) holds fewer than n
// failures within the window; 0 if it does now.
func over(ts []time.Time, n int, now time.Time) time.Duration {
	if len(ts) < n {
		return 0
	}
	return max(ts[len(ts)-n].Add(LoginWindow).Sub(now), 0)
}

// blocked reports whether a login attempt from remote must be refused
// before its token is compared (its address's failures alone decide), and
// when the next one could succeed.
func (l *loginThrottle) blocked(remote string) (time.Duration, bool) {
	key, now := clientKey(remote), l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	mine := prune(l.addrs[key], now)
	if len(mine) == 0 {
		delete(l.addrs, key)
	} else {
		l.addrs[key] = mine
	}
	wait := over(mine, LoginFailuresPerAddr, now)
	return wait, wait > 0
}

// failure is what fail found: whether the failures of all addresses
// together are over LoginFailuresTotal (answer 429, Retry-After wait
// rather than 401), and whether to log this failure (false while over the
// total, but for the first of a window).
type failure struct {
	overall bool
	wait    time.Duration
	log     bool
}

// fail records a wrong token from remote.
func (l *loginThrottle) fail(remote string) failure {
	key, now := clientKey(remote), l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, known := l.addrs[key]; !known && len(l.addrs) >= maxThrottledAddrs {
		l.makeRoom(now)
	}
	l.addrs[key] = keepLast(append(prune(l.addrs[key], now), now), LoginFailuresPerAddr)
	prior := prune(l.all, now)
	l.all = keepLast(append(prior, now), LoginFailuresTotal)
	f := failure{log: true}
	if len(prior) >= LoginFailuresTotal {
		f.overall, f.wait = true, max(over(l.all, LoginFailuresTotal, now), time.Second)
		f.log = now.Sub(l.logged) >= LoginWindow
		if f.log {
			l.logged = now
		}
	}
	return f
}

// makeRoom drops the addresses whose failures left the window and, if
// that is not an eighth of them, others, so that a flood from ever new
// addresses costs a constant time per failure.
func (l *loginThrottle) makeRoom(now time.Time) {
	for k, ts := range l.addrs {
		if len(prune(ts, now)) == 0 {
			delete(l.addrs, k)
		}
	}
	for k := range l.addrs {
		if len(l.addrs) <= maxThrottledAddrs*7/8 {
			return
		}
		delete(l.addrs, k)
	}
}

// keepLast keeps the last n of ts.
func keepLast(ts []time.Time, n int) []time.Time {
	if len(ts) > n {
		return append(ts[:0:0], ts[len(ts)-n:]...)
	}
	return ts
}

// logThrottled logs a wrong token over the total, once a window.
func (u *Handler) logThrottled(f failure, r *http.Request) {
	if f.log {
		u.log.Warn("ui: more than the allowed wrong operator tokens in a minute from all addresses; further wrong ones are answered 429 and not logged until the minute passes",
			"limit", LoginFailuresTotal, "remote", r.RemoteAddr)
	}
}

// refuseThrottled answers a throttled attempt.
func refuseThrottled(w http.ResponseWriter, wait time.Duration) {
	secs := max(int64(math.Ceil(wait.Seconds())), 1)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	http.Error(w, "too many wrong operator tokens: retry in "+strconv.FormatInt(secs, 10)+" s", http.StatusTooManyRequests)
}
