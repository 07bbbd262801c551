package proxmox

import (
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// answerServer answers /cluster/resources with running VM 101 on node pve
// and GET .../agent/network-get-interfaces and .../status/current with
// the given data (the value of "data").
func answerServer(t *testing.T, network, status string) Config {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/cluster/resources"):
			fmt.Fprint(w, `{"data":[{"id":"qemu/101","vmid":101,"node":"pve","type":"qemu","status":"running"}]}`)
		case r.URL.Path == "/api2/json/nodes/pve/qemu/101/agent/network-get-interfaces":
			fmt.Fprintf(w, `{"data":%s}`, network)
		case r.URL.Path == "/api2/json/nodes/pve/qemu/101/status/current":
			fmt.Fprintf(w, `{"data":%s}`, status)
		default:
			http.Error(w, "no", http.StatusNotImplemented)
		}
	}))
	t.Cleanup(srv.Close)
	cfg := replayServer(t, 200, "OK", nil)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	cfg.URL, cfg.CAFile = srv.URL, ca
	return cfg
}

// TestGuestNetworkAnswers: Agent.pm's {result} is unwrapped and cleaned;
// an agent error reply inside it (HTTP 200) is the agent's error, and an
// answer without a result or of the wrong shape is an error, never a list.
func TestGuestNetworkAnswers(t *testing.T) {
	eth0 := `{"name":"eth0","hardware-address":"52:54:00:AB:CD:EF","ip-addresses":[{"ip-address-type":"ipv4","ip-address":"10.0.2.15","prefix":24},` +
		`{"ip-address-type":"ipv6","ip-address":"fe80::1","prefix":64},{"ip-address-type":"ipv4","ip-address":"999.1.1.1","prefix":24}],` +
		`"statistics":{"rx-bytes":10,"rx-packets":1,"rx-errs":0,"rx-dropped":0,"tx-bytes":20,"tx-packets":2,"tx-errs":0,"tx-dropped":0}}`
	for _, tc := range []struct {
		name, data string
		want       []hypervisor.NetInterface
		errHas     string
		disabled   bool
	}{
		{name: "interfaces", data: `{"result":[` + eth0 + `,{"name":"\u001b[31mx","hardware-address":"zz"}]}`, want: []hypervisor.NetInterface{
			{Name: "eth0", MAC: "52:54:00:ab:cd:ef", Addresses: []hypervisor.IPAddress{{Family: "ipv4", Address: "10.0.2.15", Prefix: 24}, {Family: "ipv6", Address: "fe80::1", Prefix: 64}},
				Stats: &hypervisor.NetStats{RxBytes: 10, RxPackets: 1, TxBytes: 20, TxPackets: 2}},
			{Name: "[31mx", Addresses: []hypervisor.IPAddress{}}}},
		{name: "none", data: `{"result":[]}`, want: []hypervisor.NetInterface{}},
		{name: "disabled", data: `{"result":{"error":{"class":"CommandNotFound","desc":"Command guest-network-get-interfaces has been disabled"}}}`, disabled: true},
		{name: "agent error", data: `{"result":{"error":{"class":"GenericError","desc":"getifaddrs failed"}}}`, errHas: "getifaddrs failed"},
		{name: "no result", data: `{}`, errHas: "no result"},
		{name: "null result", data: `{"result":null}`, errHas: "no result"},
		{name: "not a list", data: `{"result":{"name":"eth0"}}`, errHas: "network"},
		{name: "not an object", data: `"eth0"`, errHas: "network"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriver(t, answerServer(t, tc.data, `{}`))
			got, err := d.GuestNetwork(ctxT(t), "101")
			var de *hypervisor.CommandDisabledError
			switch {
			case tc.disabled:
				if !errors.As(err, &de) {
					t.Errorf("GuestNetwork(101) answered %s = %v, %v; want a %T", tc.data, got, err, de)
				}
			case tc.errHas != "":
				if err == nil || !strings.Contains(err.Error(), tc.errHas) {
					t.Errorf("GuestNetwork(101) answered %s = %v, %v; want an error saying %q", tc.data, got, err, tc.errHas)
				}
			case err != nil || !reflect.DeepEqual(got, tc.want):
				t.Errorf("GuestNetwork(101) answered %s = %+v, %v; want %+v", tc.data, got, err, tc.want)
			}
		})
	}
}

// TestVMMetricsAnswers: vm_status's figures as VMMetrics; numbers may be
// strings (Perl scalars); negative or absent figures are not reported;
// CPUTimeNS is never made up from the cpu rate; a stopped VM has no
// counters.
func TestVMMetricsAnswers(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       hypervisor.VMMetrics
		wantErr    bool
	}{
		{name: "running 9.x", data: `{"status":"running","cpus":2,"cpu":0.53,"maxmem":2147483648,"mem":1073741824,"memhost":300000000,` +
			`"balloon":2147483648,"diskread":1000,"diskwrite":2000,"netin":30,"netout":40,"uptime":100}`,
			want: hypervisor.VMMetrics{Source: "proxmox", VCPUs: 2, MemoryBytes: hypervisor.Uint64(2147483648), BalloonBytes: hypervisor.Uint64(2147483648),
				HostRSSBytes: hypervisor.Uint64(300000000), DiskReadBytes: hypervisor.Uint64(1000), DiskWriteBytes: hypervisor.Uint64(2000),
				NetRxBytes: hypervisor.Uint64(30), NetTxBytes: hypervisor.Uint64(40)}},
		{name: "running 8.4, strings", data: `{"status":"running","cpus":"1","maxmem":"536870912","mem":1234,"diskread":"5","diskwrite":6,"netin":0,"netout":0}`,
			want: hypervisor.VMMetrics{Source: "proxmox", VCPUs: 1, MemoryBytes: hypervisor.Uint64(536870912),
				DiskReadBytes: hypervisor.Uint64(5), DiskWriteBytes: hypervisor.Uint64(6), NetRxBytes: hypervisor.Uint64(0), NetTxBytes: hypervisor.Uint64(0)}},
		{name: "stopped", data: `{"status":"stopped","cpus":1,"maxmem":536870912,"mem":0,"netin":0,"netout":0,"diskread":0}`,
			want: hypervisor.VMMetrics{Source: "proxmox", VCPUs: 1, MemoryBytes: hypervisor.Uint64(536870912)}},
		{name: "negative and huge", data: `{"status":"running","cpus":-1,"maxmem":-5,"diskread":1e30,"netin":null}`,
			want: hypervisor.VMMetrics{Source: "proxmox"}},
		{name: "not a number", data: `{"status":"running","maxmem":"lots"}`, wantErr: true},
		{name: "not an object", data: `[1,2]`, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriver(t, answerServer(t, `{}`, tc.data))
			before := time.Now()
			got, err := d.VMMetrics(ctxT(t), "101")
			if tc.wantErr {
				if err == nil || !errors.Is(err, hypervisor.ErrBackend) {
					t.Errorf("VMMetrics(101) answered %s = %+v, %v; want %v", tc.data, got, err, hypervisor.ErrBackend)
				}
				return
			}
			if err != nil || got.Time.Before(before) {
				t.Fatalf("VMMetrics(101) answered %s = %+v, %v; want figures read now", tc.data, got, err)
			}
			got.Time = time.Time{}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("VMMetrics(101) answered %s = %s; want %s", tc.data, describe(got), describe(tc.want))
			}
		})
	}
}

func describe(m hypervisor.VMMetrics) string {
	s := fmt.Sprintf("{%s %d", m.Source, m.VCPUs)
	for _, p := range []*uint64{m.CPUTimeNS, m.MemoryBytes, m.BalloonBytes, m.HostRSSBytes, m.DiskReadBytes, m.DiskWriteBytes, m.DiskReadOps, m.DiskWriteOps, m.NetRxBytes, m.NetTxBytes} {
		if p == nil {
			s += " nil"
		} else {
			s += fmt.Sprintf(" %d", *p)
		}
	}
	return s + "}"
}
