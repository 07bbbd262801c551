#!/usr/bin/env bash
# Installs what the tests need on a Debian machine, and nothing that is
# already there: the Debian packages below (with sudo unless root), node and
# npm when missing, and the end-to-end tests' npm packages (npm ci, pinned
# by e2e/package-lock.json and e2e/conformance/package-lock.json) when a
# node_modules is missing or older than its lock file (one that is a
# symbolic link, shared with another checkout, is left alone: npm ci would
# empty the directory it points to). `make test` runs it first; .ci/run too.
#
# The libvirt tests start daemons of their own in private mount namespaces
# (internal/libvirttest), so a system libvirtd the packages start is left
# alone: the tests neither use nor disturb it.
set -euo pipefail
cd "$(dirname "$0")/.."

# The lab VM (qemu, the guest agent, busybox and cpio for the initramfs),
# qemu-img for snapshots and overlays, Redis and its Sentinel for the replica
# store and its failover, libvirt for the libvirt driver, chromium for the
# approvals page, tesseract to read text typed on a VM's screen back from
# its screenshot, Vagrant with its libvirt provider for README's Vagrant
# lines (internal/readmetest runs `vagrant validate`).
pkgs=(qemu-system-x86 qemu-utils qemu-guest-agent busybox-static cpio redis-server redis-sentinel
	libvirt-daemon-system libvirt-clients chromium tesseract-ocr vagrant vagrant-libvirt)

sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo

missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ "${#missing[@]}" -gt 0 ]; then
	echo "deps: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get update
	$sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi

# The end-to-end tests drive vmgate with the official MCP TypeScript SDK
# (e2e), and run the official MCP conformance suite on the Node 22 binary
# its lock pins (e2e/conformance: the suite needs Node 22, the machine's
# node stays what it is).
for dir in e2e e2e/conformance; do
	if [ -L "$dir/node_modules" ]; then
		echo "deps: $dir/node_modules is a symbolic link: left as it is"
	elif [ ! -e "$dir/node_modules/.package-lock.json" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
		echo "deps: npm ci in $dir"
		npm ci --prefix "$dir" --no-audit --no-fund
	fi
done
