package hypervisor

import (
	"reflect"
	"strings"
	"testing"
)

func TestCleanNetInterfaces(t *testing.T) {
	tests := []struct {
		name string
		in   []NetInterface
		want []NetInterface
	}{
		{"nil gives empty", nil, []NetInterface{}},
		{"lab guest", []NetInterface{
			{Name: "lo", MAC: "00:00:00:00:00:00", Addresses: []IPAddress{
				{Family: "ipv4", Address: "127.0.0.1", Prefix: 8}, {Family: "ipv6", Address: "::1", Prefix: 128}}},
			{Name: "eth0", MAC: "52:54:00:12:34:56", Addresses: []IPAddress{
				{Family: "ipv4", Address: "10.0.2.15", Prefix: 24}, {Family: "ipv6", Address: "fe80::5054:ff:fe12:3456%eth0", Prefix: 64}},
				Stats: &NetStats{RxBytes: 10, TxBytes: 20}},
		}, []NetInterface{
			{Name: "lo", MAC: "00:00:00:00:00:00", Addresses: []IPAddress{
				{Family: "ipv4", Address: "127.0.0.1", Prefix: 8}, {Family: "ipv6", Address: "::1", Prefix: 128}}},
			{Name: "eth0", MAC: "52:54:00:12:34:56", Addresses: []IPAddress{
				{Family: "ipv4", Address: "10.0.2.15", Prefix: 24}, {Family: "ipv6", Address: "fe80::5054:ff:fe12:3456", Prefix: 64}},
				Stats: &NetStats{RxBytes: 10, TxBytes: 20}},
		}},
		{"normalised", []NetInterface{{Name: " eth0 ", MAC: "52-54-00-AB-CD-EF", Addresses: []IPAddress{
			{Family: "IPv6", Address: "2001:DB8:0:0::1", Prefix: 64}}}},
			[]NetInterface{{Name: "eth0", MAC: "52:54:00:ab:cd:ef", Addresses: []IPAddress{{Family: "ipv6", Address: "2001:db8::1", Prefix: 64}}}}},
		{"hostile values dropped", []NetInterface{{Name: "e\x1b[31mth\x000\n", MAC: "not-a-mac", Addresses: []IPAddress{
			{Family: "ipv4", Address: "999.1.1.1", Prefix: 24},
			{Family: "ipv4", Address: "10.0.0.1", Prefix: 33},
			{Family: "ipv4", Address: "10.0.0.1", Prefix: -1},
			{Family: "ipv6", Address: "10.0.0.1", Prefix: 24},
			{Family: "ipv4", Address: "10.0.0.1%eth0", Prefix: 24},
			{Family: "ipv4", Address: "", Prefix: 0},
			{Family: "ipv4", Address: strings.Repeat("1", 100), Prefix: 0},
			{Family: "ipv4", Address: "10.0.0.2", Prefix: 24},
		}}}, []NetInterface{{Name: "e[31mth0", Addresses: []IPAddress{{Family: "ipv4", Address: "10.0.0.2", Prefix: 24}}}}},
		{"nameless dropped", []NetInterface{{Name: "\x00\x01 "}, {Name: "ok"}}, []NetInterface{{Name: "ok", Addresses: []IPAddress{}}}},
		{"bad utf8 removed", []NetInterface{{Name: "a\xffb"}}, []NetInterface{{Name: "ab", Addresses: []IPAddress{}}}},
	}
	for _, tt := range tests {
		got := CleanNetInterfaces(tt.in)
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: CleanNetInterfaces(%+v) = %+v; want %+v", tt.name, tt.in, got, tt.want)
		}
	}
}

func TestCleanNetInterfacesBounds(t *testing.T) {
	addrs := make([]IPAddress, 10*MaxInterfaceAddrs)
	for i := range addrs {
		addrs[i] = IPAddress{Family: "ipv4", Address: "10.0.0.1", Prefix: 8}
	}
	in := make([]NetInterface, 10*MaxNetInterfaces)
	for i := range in {
		in[i] = NetInterface{Name: strings.Repeat("n", 10000), Addresses: addrs}
	}
	got := CleanNetInterfaces(in)
	if len(got) != MaxNetInterfaces {
		t.Fatalf("CleanNetInterfaces(%d interfaces) kept %d; want %d", len(in), len(got), MaxNetInterfaces)
	}
	if n := len([]rune(got[0].Name)); n != MaxInterfaceName {
		t.Errorf("CleanNetInterfaces: a 10000-byte name kept %d runes; want %d", n, MaxInterfaceName)
	}
	if n := len(got[0].Addresses); n != MaxInterfaceAddrs {
		t.Errorf("CleanNetInterfaces: %d addresses kept %d; want %d", len(addrs), n, MaxInterfaceAddrs)
	}
	// The input is not modified (its stats are copied, not shared).
	st := &NetStats{RxBytes: 1}
	out := CleanNetInterfaces([]NetInterface{{Name: "x", Stats: st}})
	out[0].Stats.RxBytes = 2
	if st.RxBytes != 1 {
		t.Errorf("CleanNetInterfaces shares Stats with its input; want a copy")
	}
}
