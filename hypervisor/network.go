package hypervisor

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"unicode"
	"unicode/utf8"
)

// GuestNetworker is an optional capability: a driver that can ask the
// guest for its network interfaces (the guest agent's
// guest-network-get-interfaces, VirtualBox's guest properties) implements it.
type GuestNetworker interface {
	// GuestNetwork returns the guest's interfaces as the guest reports them,
	// cleaned with CleanNetInterfaces. ErrAgentUnavailable when the guest
	// agent does not answer; a *CommandDisabledError when the guest forbids
	// the command.
	GuestNetwork(ctx context.Context, vm string) ([]NetInterface, error)
}

// NetInterface is one network interface of a guest.
type NetInterface struct {
	Name string `json:"name"`
	// MAC is the hardware address, lowercase colon-separated; empty when the
	// interface has none (loopback) or the guest did not say.
	MAC       string      `json:"mac,omitempty"`
	Addresses []IPAddress `json:"addresses"`
	// Stats are the interface's counters when the guest reports them.
	Stats *NetStats `json:"stats,omitempty"`
}

// IPAddress is one address of an interface.
type IPAddress struct {
	// Family is "ipv4" or "ipv6".
	Family  string `json:"family"`
	Address string `json:"address"`
	Prefix  int    `json:"prefix"`
}

// NetStats are an interface's counters since the guest booted.
type NetStats struct {
	RxBytes   uint64 `json:"rx_bytes"`
	RxPackets uint64 `json:"rx_packets"`
	RxErrors  uint64 `json:"rx_errors"`
	RxDropped uint64 `json:"rx_dropped"`
	TxBytes   uint64 `json:"tx_bytes"`
	TxPackets uint64 `json:"tx_packets"`
	TxErrors  uint64 `json:"tx_errors"`
	TxDropped uint64 `json:"tx_dropped"`
}

// Bounds CleanNetInterfaces applies to what a guest reports.
const (
	MaxNetInterfaces   = 256
	MaxInterfaceAddrs  = 256
	MaxInterfaceName   = 64
	maxNetRawNameBytes = 4 * MaxInterfaceName
)

// CleanNetInterfaces makes a guest's answer safe to show: the guest is not
// trusted, so at most MaxNetInterfaces interfaces with at most
// MaxInterfaceAddrs addresses each are kept; names lose control characters
// and are cut to MaxInterfaceName runes (an interface with no name left is
// dropped); a MAC that does not parse is dropped (others are normalised);
// addresses that do not parse, or whose family or prefix do not match, are
// dropped, the rest normalised. It returns a new slice; a nil input gives
// an empty, non-nil one.
func CleanNetInterfaces(in []NetInterface) []NetInterface {
	out := make([]NetInterface, 0, min(len(in), MaxNetInterfaces))
	for _, ifc := range in {
		if len(out) == MaxNetInterfaces {
			break
		}
		name := cleanName(ifc.Name)
		if name == "" {
			continue
		}
		c := NetInterface{Name: name, MAC: cleanMAC(ifc.MAC), Addresses: []IPAddress{}}
		for _, a := range ifc.Addresses {
			if len(c.Addresses) == MaxInterfaceAddrs {
				break
			}
			if ca, ok := cleanAddress(a); ok {
				c.Addresses = append(c.Addresses, ca)
			}
		}
		if ifc.Stats != nil {
			s := *ifc.Stats
			c.Stats = &s
		}
		out = append(out, c)
	}
	return out
}

func cleanName(s string) string {
	if len(s) > maxNetRawNameBytes {
		s = s[:maxNetRawNameBytes]
	}
	var b strings.Builder
	n := 0
	for _, r := range strings.ToValidUTF8(s, "") {
		if n == MaxInterfaceName {
			break
		}
		if unicode.IsControl(r) || r == utf8.RuneError {
			continue
		}
		b.WriteRune(r)
		n++
	}
	return strings.TrimSpace(b.String())
}

func cleanMAC(s string) string {
	if s == "" || len(s) > 64 {
		return ""
	}
	hw, err := net.ParseMAC(s)
	if err != nil {
		return ""
	}
	return hw.String()
}

func cleanAddress(a IPAddress) (IPAddress, bool) {
	if len(a.Address) > 64 {
		return IPAddress{}, false
	}
	ip, err := netip.ParseAddr(a.Address)
	if err != nil || ip.Zone() != "" && !ip.Is6() {
		return IPAddress{}, false
	}
	ip = ip.WithZone("") // a zone is the guest's interface name; Name says it already
	family, bits := "ipv6", 128
	if ip.Is4() {
		family, bits = "ipv4", 32
	}
	if a.Family != "" && !strings.EqualFold(a.Family, family) {
		return IPAddress{}, false
	}
	if a.Prefix < 0 || a.Prefix > bits {
		return IPAddress{}, false
	}
	return IPAddress{Family: family, Address: ip.String(), Prefix: a.Prefix}, true
}
