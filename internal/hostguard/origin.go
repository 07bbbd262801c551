package hostguard

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrNotOrigin: a string that is not an origin as a browser serializes it.
var ErrNotOrigin = errors.New("not an origin")

// ParseOrigin checks that o is an origin as a browser sends it in the
// Origin header: "http" or "https", "://", a lowercase host (a name, an
// IPv4 address, or an IPv6 address in brackets) and an optional port
// (1–65535), with no path, no trailing slash, no user, no query. It returns
// the host (IPv6 with its brackets) and the port ("" for none).
func ParseOrigin(o string) (host, port string, err error) {
	rest, ok := strings.CutPrefix(o, "http://")
	if !ok {
		if rest, ok = strings.CutPrefix(o, "https://"); !ok {
			return "", "", fmt.Errorf("%w: %q does not start with http:// or https://", ErrNotOrigin, o)
		}
	}
	if rest == "" || strings.ContainsAny(rest, "/?#@\\ ") {
		return "", "", fmt.Errorf("%w: %q has a path, a user, a query or nothing after the scheme", ErrNotOrigin, o)
	}
	host = rest
	if i := strings.LastIndexByte(rest, ':'); i >= 0 && !strings.HasSuffix(rest, "]") {
		host, port = rest[:i], rest[i+1:]
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || port != strconv.Itoa(n) {
			return "", "", fmt.Errorf("%w: %q has a bad port %q", ErrNotOrigin, o, port)
		}
	}
	if strings.HasPrefix(host, "[") != strings.HasSuffix(host, "]") || strings.Count(host, ":") > 0 && !strings.HasPrefix(host, "[") {
		return "", "", fmt.Errorf("%w: %q: an IPv6 address goes in brackets", ErrNotOrigin, o)
	}
	if host == "" || host == "[]" || host != strings.ToLower(host) {
		return "", "", fmt.Errorf("%w: %q: the host must be lowercase, as a browser sends it", ErrNotOrigin, o)
	}
	return host, port, nil
}

// LoopbackOrigin reports whether o is an origin of this machine's
// loopback: localhost, 127.0.0.1 or [::1], over http or https, with any
// port (or none).
func LoopbackOrigin(o string) bool {
	host, _, err := ParseOrigin(o)
	return err == nil && (host == "localhost" || host == "127.0.0.1" || host == "[::1]")
}
