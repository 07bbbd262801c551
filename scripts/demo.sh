#!/usr/bin/env bash
# The demo: installs the Debian packages if missing, builds vmgate, boots a
# lab VM, and serves MCP over streamable HTTP on 127.0.0.1:8707 with a
# freshly generated bearer token and operator token, printing how to
# connect Claude Desktop, Claude Code and the MCP Inspector, and how to open
# the approvals page. Ctrl-C stops the server; the lab VM keeps running
# until `bin/vmgate lab down`.
#
# Environment: VMGATE_STATE_DIR (state directory), VMGATE_DEMO_ADDR
# (default 127.0.0.1:8707), VMGATE_DEMO_BIN (where make build puts the
# binaries; default bin), GO (default go).
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
ADDR=${VMGATE_DEMO_ADDR:-127.0.0.1:8707}
BINDIR=${VMGATE_DEMO_BIN:-bin}
# The MCP Inspector version README pins (its CLI mode runs on Node 20).
INSPECTOR=@modelcontextprotocol/inspector@0.21.2
DEB_PKGS=(qemu-system-x86 qemu-utils qemu-guest-agent busybox-static cpio)

missing=()
for p in "${DEB_PKGS[@]}"; do
	dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
	echo "installing: ${missing[*]}"
	SUDO=""
	[ "$(id -u)" = 0 ] || SUDO=sudo
	$SUDO apt-get update
	$SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi

# vmgate and the in-guest helper it pushes into guests (see the Makefile).
make -s build GO="$GO" BIN="$BINDIR"
BIN=$(cd "$BINDIR" && pwd)/vmgate

STATE=${VMGATE_STATE_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/vmgate}
export VMGATE_STATE_DIR=$STATE
mkdir -p "$STATE/demo"
chmod 700 "$STATE" "$STATE/demo"

if ! "$BIN" lab status 2>/dev/null | grep -Eq '^vm1[[:space:]]+running'; then
	"$BIN" lab up --vms 1
fi
"$BIN" lab status

# New tokens for every demo run, the agent's and the operator's (the
# approvals page /ui); only their SHA-256 goes into the config.
umask 077
newtoken() { head -c 32 /dev/urandom | base64 | tr -d '/+=\n'; }
TOKEN=$(newtoken)
OPTOKEN=$(newtoken)
printf '%s\n' "$TOKEN" >"$STATE/demo/token"
printf '%s\n' "$OPTOKEN" >"$STATE/demo/operator-token"
HASH=$(printf '%s' "$TOKEN" | sha256sum | cut -d' ' -f1)
OPHASH=$(printf '%s' "$OPTOKEN" | sha256sum | cut -d' ' -f1)
CONFIG=$STATE/demo/vmgate.yaml
cat >"$CONFIG" <<EOF
# Written by scripts/demo.sh; regenerated on every run.
state_dir: "$STATE"
operator: {name: demo-operator, token_sha256: $OPHASH}
grants:
  - name: local
    policy: builtin:default
  - name: demo
    token_sha256: $HASH
    policy: builtin:default
backends:
  - name: lab
    driver: qemu
    settings:
      lab: true
EOF

URL=http://$ADDR/mcp
cat <<EOF

vmgate is serving MCP at $URL (grant "demo", the built-in default policy).
Bearer token (also in $STATE/demo/token):

  $TOKEN

Claude Code:
  claude mcp add --transport http vmgate $URL --header "Authorization: Bearer $TOKEN"

Claude Desktop (Settings > Developer > Edit Config, claude_desktop_config.json;
mcp-remote bridges Desktop's stdio to this HTTP server):
  {
    "mcpServers": {
      "vmgate": {
        "command": "npx",
        "args": ["-y", "mcp-remote", "$URL", "--header", "Authorization: Bearer $TOKEN"]
      }
    }
  }

MCP Inspector, CLI mode (runs on Node 20):
  npx -y $INSPECTOR --cli $URL --transport http --header "Authorization: Bearer $TOKEN" --method tools/list
Its web UI (Node 22): npx -y $INSPECTOR, then Transport Type "Streamable HTTP",
  URL $URL, Authentication: header "Authorization", value "Bearer $TOKEN"; Connect.

Approvals page (calls waiting for an operator): http://$ADDR/ui
  operator token (also in $STATE/demo/operator-token): $OPTOKEN

From a shell:
  VMGATE_TOKEN=$TOKEN $BIN call list_vms --url $URL
  VMGATE_TOKEN=$TOKEN $BIN call vm_agent_exec --url $URL --args '{"vm":"lab/vm1","command":["uname","-a"]}'
  $BIN approvals list --config $CONFIG        (calls waiting for an operator)
  $BIN approvals grant ID --config $CONFIG
  $BIN audit verify $STATE/audit.log

Ctrl-C stops the server; "$BIN lab down" stops the lab VM.

EOF
exec "$BIN" serve --config "$CONFIG" --http "$ADDR"
