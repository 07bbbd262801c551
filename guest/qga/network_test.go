package qga

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// testdata/network-interfaces.json is qemu-ga 7.2's reply to
// guest-network-get-interfaces in the lab guest (a virtio NIC on QEMU's
// user network, IPv6 by SLAAC), recorded from a lab VM.
func TestNetworkInterfacesDecoding(t *testing.T) {
	line, err := os.ReadFile(filepath.Join("testdata", "network-interfaces.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got []NetworkInterface
	if err := DecodeReply("guest-network-get-interfaces", line, &got); err != nil {
		t.Fatalf("DecodeReply() = %v", err)
	}
	want := []NetworkInterface{
		{Name: "lo", HardwareAddress: "00:00:00:00:00:00", IPAddresses: []IPAddress{
			{Type: "ipv4", Address: "127.0.0.1", Prefix: 8}, {Type: "ipv6", Address: "::1", Prefix: 128}},
			Statistics: &NetworkStats{}},
		{Name: "eth0", HardwareAddress: "52:54:00:12:34:56", IPAddresses: []IPAddress{
			{Type: "ipv4", Address: "10.0.2.15", Prefix: 24},
			{Type: "ipv6", Address: "fec0::5054:ff:fe12:3456", Prefix: 64},
			{Type: "ipv6", Address: "fe80::5054:ff:fe12:3456", Prefix: 64}},
			Statistics: &NetworkStats{RxBytes: 110, RxPackets: 1, TxBytes: 602, TxPackets: 7}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("guest-network-get-interfaces decoded = %+v; want %+v", got, want)
	}
	// Through Agent, over a Caller that answers the same.
	f := &fakeCaller{reply: func(command string, _ json.RawMessage) (any, error) {
		if command != "guest-network-get-interfaces" {
			t.Errorf("command %q; want guest-network-get-interfaces", command)
		}
		return got, nil
	}}
	ifs, err := Agent{Caller: f}.NetworkInterfaces(context.Background())
	if err != nil || !reflect.DeepEqual(ifs, want) {
		t.Errorf("NetworkInterfaces() = %+v, %v; want %+v", ifs, err, want)
	}
}
