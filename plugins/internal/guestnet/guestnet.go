// Package guestnet turns the guest agent's answer to
// guest-network-get-interfaces (guest/qga's types) into the driver
// contract's, cleaned of what a hostile guest could put there
// (hypervisor.CleanNetInterfaces). The QGA-based drivers share it.
package guestnet

import (
	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
)

// FromQGA converts and cleans the agent's interfaces.
func FromQGA(ifs []qga.NetworkInterface) []hypervisor.NetInterface {
	out := make([]hypervisor.NetInterface, 0, min(len(ifs), hypervisor.MaxNetInterfaces))
	for _, q := range ifs {
		if len(out) == hypervisor.MaxNetInterfaces {
			break
		}
		n := hypervisor.NetInterface{Name: q.Name, MAC: q.HardwareAddress}
		for _, a := range q.IPAddresses[:min(len(q.IPAddresses), hypervisor.MaxInterfaceAddrs)] {
			n.Addresses = append(n.Addresses, hypervisor.IPAddress{Family: a.Type, Address: a.Address, Prefix: a.Prefix})
		}
		if s := q.Statistics; s != nil {
			n.Stats = &hypervisor.NetStats{
				RxBytes: s.RxBytes, RxPackets: s.RxPackets, RxErrors: s.RxErrs, RxDropped: s.RxDropped,
				TxBytes: s.TxBytes, TxPackets: s.TxPackets, TxErrors: s.TxErrs, TxDropped: s.TxDropped,
			}
		}
		out = append(out, n)
	}
	return hypervisor.CleanNetInterfaces(out)
}
