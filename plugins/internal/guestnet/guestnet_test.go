package guestnet

import (
	"reflect"
	"testing"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
)

func TestFromQGA(t *testing.T) {
	in := []qga.NetworkInterface{
		{Name: "lo", HardwareAddress: "00:00:00:00:00:00", IPAddresses: []qga.IPAddress{
			{Type: "ipv4", Address: "127.0.0.1", Prefix: 8}, {Type: "ipv6", Address: "::1", Prefix: 128}},
			Statistics: &qga.NetworkStats{}},
		{Name: "eth0", HardwareAddress: "52:54:00:12:34:56", IPAddresses: []qga.IPAddress{
			{Type: "ipv4", Address: "10.0.2.15", Prefix: 24}, {Type: "ipv6", Address: "fe80::5054:ff:fe12:3456%eth0", Prefix: 64},
			{Type: "ipv4", Address: "not an address", Prefix: 24}},
			Statistics: &qga.NetworkStats{RxBytes: 110, RxPackets: 1, RxErrs: 2, RxDropped: 3, TxBytes: 602, TxPackets: 7, TxErrs: 4, TxDropped: 5}},
		{Name: "\x00"}, // no name left: dropped
	}
	want := []hypervisor.NetInterface{
		{Name: "lo", MAC: "00:00:00:00:00:00", Addresses: []hypervisor.IPAddress{
			{Family: "ipv4", Address: "127.0.0.1", Prefix: 8}, {Family: "ipv6", Address: "::1", Prefix: 128}},
			Stats: &hypervisor.NetStats{}},
		{Name: "eth0", MAC: "52:54:00:12:34:56", Addresses: []hypervisor.IPAddress{
			{Family: "ipv4", Address: "10.0.2.15", Prefix: 24}, {Family: "ipv6", Address: "fe80::5054:ff:fe12:3456", Prefix: 64}},
			Stats: &hypervisor.NetStats{RxBytes: 110, RxPackets: 1, RxErrors: 2, RxDropped: 3, TxBytes: 602, TxPackets: 7, TxErrors: 4, TxDropped: 5}},
	}
	if got := FromQGA(in); !reflect.DeepEqual(got, want) {
		t.Errorf("FromQGA() = %+v; want %+v", got, want)
	}
	many := make([]qga.NetworkInterface, 3*hypervisor.MaxNetInterfaces)
	for i := range many {
		many[i] = qga.NetworkInterface{Name: "x", IPAddresses: make([]qga.IPAddress, 3*hypervisor.MaxInterfaceAddrs)}
	}
	got := FromQGA(many)
	if len(got) != hypervisor.MaxNetInterfaces || len(got[0].Addresses) != 0 {
		t.Errorf("FromQGA(%d interfaces of %d empty addresses) = %d interfaces, %d addresses; want %d, 0",
			len(many), 3*hypervisor.MaxInterfaceAddrs, len(got), len(got[0].Addresses), hypervisor.MaxNetInterfaces)
	}
}
