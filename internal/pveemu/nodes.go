package pveemu

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// The cluster's nodes. Every node of Options.Nodes is a member
// (corosync.conf's nodelist, pve-cluster src/PVE/Cluster.pm get_members);
// the first serves the API, as the node a client talks to does, and a
// request for another node is forwarded to it by pve-http-server's
// proxy_request (pve-manager PVE/HTTPServer.pm rest_handler, proxyto). The
// emulated nodes share this host, so forwarding is a function call; what
// shows is what a real forward shows when it fails.
//
// A node taken offline (SetNodeOnline) is a member that lost its corosync
// link: get_members marks it offline at once, its pvestatd broadcasts no
// more status, and pveproxy cannot connect to it. Its VMs stay configured
// on it (their configs are in the cluster file system) and their last
// status broadcast is kept by pmxcfs for rrdExpire.

// rrdExpire is how long pmxcfs keeps a node's or a VM's last status
// broadcast (pve-cluster src/pmxcfs/status.c, rrd_entry_is_old: "remove
// everything older than 5 minutes", run by cfs_rrd_dump).
const rrdExpire = 5 * time.Minute

// rrdEntry is a VM's last status broadcast and when pmxcfs got it.
type rrdEntry struct {
	status string
	at     time.Time
}

// SetNodeOnline takes a node offline (false) or brings it back (true). The
// first node, which serves the API, cannot go offline.
func (e *Emulator) SetNodeOnline(node string, online bool) error {
	if !e.hasNode(node) {
		return fmt.Errorf("pveemu: no node %q", node)
	}
	if node == e.nodes[0] && !online {
		return fmt.Errorf("pveemu: node %s serves the API and cannot go offline", node)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if online {
		// Its pvestatd broadcasts again; its VMs follow with the next sample.
		delete(e.offline, node)
		e.nodeSeen[node] = e.nowLocked()
		return nil
	}
	if !e.offline[node] {
		e.offline[node] = true
		e.nodeSeen[node] = e.nowLocked()
	}
	return nil
}

// nowLocked is the clock of the status broadcasts (mu held): the time, or
// later when a test moved it.
func (e *Emulator) nowLocked() time.Time { return time.Now().Add(e.skew) }

// nodeOnline reports whether node is a member with its corosync link up.
func (e *Emulator) nodeOnline(node string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hasNode(node) && !e.offline[node]
}

// quorate is corosync's quorum: more than half the members online
// (one vote each, no QDevice).
func (e *Emulator) quorate() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return 2*(len(e.nodes)-len(e.offline)) > len(e.nodes)
}

// nodeIP is a member's address in corosync.conf (ring0_addr), which
// PVE::Cluster::remote_node_ip answers: documentation addresses
// (192.0.2.0/24), since every emulated node is this host.
func (e *Emulator) nodeIP(node string) string {
	for i, n := range e.nodes {
		if n == node {
			return fmt.Sprintf("192.0.2.%d", i+1)
		}
	}
	return ""
}

// proxyFailure is pveproxy's answer when it cannot forward a request to
// an offline node: pve-http-server src/PVE/APIServer/AnyEvent.pm
// proxy_request passes AnyEvent::HTTP's pseudo status on, and http_request's
// connect callback reports a failed connection as Status 595 ("errors
// during connection establishment") with Reason "$!"; a powered-off node on
// the same network gives EHOSTUNREACH. The answer is
// HTTP::Response->new(595, "No route to host", $header, undef): the status
// line and no body (real servers' access logs show `595 -`).
func proxyFailure() *apiError {
	return &apiError{code: 595, msg: "No route to host", bare: true}
}

// nodeStats is pve-manager PVE/API2Tools.pm extract_node_stats: "unknown"
// without a status broadcast from the node, "online" with one from a member
// online, "offline" for a member offline; the figures only with Sys.Audit
// on /nodes/{node} (level and the maxima also without). The figures are
// this host's, since every emulated node is.
func (e *Emulator) nodeStats(node string, canAudit bool) map[string]any {
	e.mu.Lock()
	now := e.nowLocked()
	seen, ok := e.nodeSeen[node]
	offline := e.offline[node]
	e.mu.Unlock()
	entry := map[string]any{"id": "node/" + node, "node": node, "type": "node", "status": "unknown"}
	if ok && now.Sub(seen) <= rrdExpire {
		if !offline {
			entry["status"] = "online"
			if canAudit {
				entry["uptime"] = int64(now.Sub(processStart).Seconds())
				entry["cpu"], entry["mem"], entry["disk"] = 0, 0, 0
			}
		}
		entry["level"] = "" // no subscription
		if canAudit {
			var si syscall.Sysinfo_t
			syscall.Sysinfo(&si)
			entry["maxcpu"], entry["maxmem"], entry["maxdisk"] = runtime.NumCPU(), int64(si.Totalram)*int64(si.Unit), 0
		}
	}
	if offline {
		entry["status"] = "offline"
	}
	return entry
}

// nodeEntries are the node entries of cluster/resources: nodeStats plus
// the static info pvestatd broadcasts once (cgroup v2 since PVE 7).
func (e *Emulator) nodeEntries(r *request) []map[string]any {
	e.sample() // the nodes' broadcasts come with the VMs'
	out := make([]map[string]any, 0, len(e.nodes))
	for _, n := range e.nodes {
		entry := e.nodeStats(n, e.check(r.token, "/nodes/"+n, "Sys.Audit") == nil)
		entry["cgroup-mode"] = 2
		out = append(out, entry)
	}
	return out
}

// nodesIndex is pve-manager PVE/API2/Nodes.pm "index" (GET /nodes,
// permissions user => 'all'): every member with extract_node_stats and its
// certificate's fingerprint (PVE::Cluster::get_node_fingerprint).
func (e *Emulator) nodesIndex(r *request) (any, *apiError) {
	e.sample()
	fp := sha256.Sum256(e.srv.Certificate().Raw)
	hexes := make([]string, len(fp))
	for i, b := range fp {
		hexes[i] = fmt.Sprintf("%02X", b)
	}
	out := make([]map[string]any, 0, len(e.nodes))
	for _, n := range e.nodes {
		entry := e.nodeStats(n, e.check(r.token, "/nodes/"+n, "Sys.Audit") == nil)
		entry["ssl_fingerprint"] = strings.Join(hexes, ":")
		delete(entry, "type")
		delete(entry, "id")
		out = append(out, entry)
	}
	return out, nil
}

// clusterStatus is pve-manager PVE/API2/Cluster.pm get_status (GET
// /cluster/status, Sys.Audit on /): the cluster (name, node count, the
// corosync config version, quorum) and each member (id, address, whether it
// is the node answering, online).
func (e *Emulator) clusterStatus(r *request) (any, *apiError) {
	out := []map[string]any{{"type": "cluster", "id": "cluster", "name": "pveemu", "nodes": len(e.nodes),
		"version": len(e.nodes), "quorate": b2i(e.quorate())}}
	e.sample()
	for i, n := range e.nodes {
		out = append(out, map[string]any{"type": "node", "id": "node/" + n, "name": n, "nodeid": i + 1,
			"local": b2i(i == 0), "online": b2i(e.nodeOnline(n)), "ip": e.nodeIP(n), "level": ""})
	}
	return out, nil
}

// writeBare writes an answer pveproxy makes itself from a failed forward:
// the status line, its own headers, no body (so no Content-Length), and the
// connection closed (AnyEvent.pm response: keep_alive off for code >= 400).
func writeBare(w http.ResponseWriter, code int, reason string) {
	date := time.Now().UTC().Format(http.TimeFormat)
	if !hijack(w, func(buf *bufio.ReadWriter) {
		fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\nCache-Control: max-age=0\r\nConnection: close\r\nDate: %s\r\nPragma: no-cache\r\n"+
			"Server: pve-api-daemon/3.0\r\nExpires: %s\r\n\r\n", code, reason, date, date)
	}) {
		w.WriteHeader(code)
	}
}
