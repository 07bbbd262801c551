// Package hostguard checks an HTTP request's Host header against DNS
// rebinding: a page on an attacker's domain that resolves to 127.0.0.1
// still sends its own name as Host, so only loopback names and addresses
// and the hosts the operator configured are let through. The functions are
// pure and safe for concurrent use.
package hostguard

import (
	"net"
	"net/netip"
	"slices"
	"strings"
)

// Allowed reports whether host (a Host header, with or without a port) is
// localhost, a loopback address, or one of allowed (compared with and
// without the port, case-insensitively).
func Allowed(host string, allowed []string) bool {
	h := hostname(host)
	if strings.EqualFold(h, "localhost") {
		return true
	}
	if ip, err := netip.ParseAddr(h); err == nil && ip.IsLoopback() {
		return true
	}
	return slices.ContainsFunc(allowed, func(a string) bool {
		return strings.EqualFold(a, host) || strings.EqualFold(a, h)
	})
}

// AllowedOrAddress is Allowed, or host is an IP address literal. A listener
// scraped from other machines by address (Prometheus on /metrics) uses it:
// rebinding needs a name, so an address cannot be one.
func AllowedOrAddress(host string, allowed []string) bool {
	if _, err := netip.ParseAddr(hostname(host)); err == nil {
		return true
	}
	return Allowed(host, allowed)
}

// hostname is host without its port and IPv6 brackets.
func hostname(host string) string {
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
	}
	return strings.Trim(h, "[]")
}
