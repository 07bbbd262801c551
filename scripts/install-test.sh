#!/usr/bin/env bash
# The install test (.ci/run runs it): `make install` into a temporary
# DESTDIR lays out vmgate, the guest helpers, the unit and the config with
# the right modes; a second install keeps an edited config; `make
# uninstall` removes what install put there and keeps an edited config.
# With --deb it then builds the Debian package (make deb), installs it
# with dpkg -i, runs `vmgate version`, checks the unit with
# `systemd-analyze verify` and removes the package again (root only: it
# installs into the system).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "install-test: $*" >&2; exit 1; }
mode() { # PATH WANT: PATH exists with permission bits WANT
	[ -e "$1" ] || fail "$1 missing"
	local got
	got=$(stat -c %a "$1")
	[ "$got" = "$2" ] || fail "$1 has mode $got; want $2"
}

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
make -s install DESTDIR="$root"
mode "$root/usr/local/bin/vmgate" 755
mode "$root/usr/local/lib/vmgate/vmgate-guest-linux-amd64" 755
mode "$root/usr/local/lib/vmgate/vmgate-guest-linux-arm64" 755
mode "$root/usr/local/lib/systemd/system/vmgate.service" 644
mode "$root/etc/vmgate/vmgate.yaml" 644
grep -qx 'ExecStart=/usr/local/bin/vmgate serve --config /etc/vmgate/vmgate.yaml --http 127.0.0.1:8707' \
	"$root/usr/local/lib/systemd/system/vmgate.service" || fail "the unit's ExecStart does not name the installed vmgate and config"
cmp -s packaging/vmgate.yaml "$root/etc/vmgate/vmgate.yaml" || fail "the installed config is not packaging/vmgate.yaml"
"$root/usr/local/bin/vmgate" version | grep -q '^vmgate 0\.0\.0~git' || fail "vmgate version does not print the build's version"

echo "# edited" >>"$root/etc/vmgate/vmgate.yaml"
make -s install DESTDIR="$root" >/dev/null
grep -q '^# edited$' "$root/etc/vmgate/vmgate.yaml" || fail "a second install replaced the edited config"
make -s uninstall DESTDIR="$root" >/dev/null
for f in usr/local/bin/vmgate usr/local/lib/vmgate usr/local/lib/systemd/system/vmgate.service; do
	[ ! -e "$root/$f" ] || fail "uninstall left $f"
done
[ -e "$root/etc/vmgate/vmgate.yaml" ] || fail "uninstall removed the edited config"
cp packaging/vmgate.yaml "$root/etc/vmgate/vmgate.yaml"
make -s uninstall DESTDIR="$root" >/dev/null
[ ! -e "$root/etc/vmgate" ] || fail "uninstall left the unedited config"
echo "install-test: make install and uninstall ok"

[ "${1:-}" = "--deb" ] || exit 0
[ "$(id -u)" = 0 ] || fail "--deb installs the package: run as root"
dpkg-query -W vmgate >/dev/null 2>&1 && fail "a vmgate package is already installed; this test would remove it"
command -v systemd-analyze >/dev/null || fail "systemd-analyze missing (Debian package systemd)"
make -s deb
deb=$(ls -t bin/vmgate_*.deb | head -n 1)
dpkg -i "$deb"
trap 'dpkg --purge vmgate >/dev/null 2>&1 || true; rm -rf "$root"' EXIT
dpkg-query -W -f='${Conffiles}\n' vmgate | grep -q '^ /etc/vmgate/vmgate.yaml ' || fail "/etc/vmgate/vmgate.yaml is not a conffile"
/usr/bin/vmgate version
# verify exits 0 on unknown keys and bad values (it warns): any output fails.
out=$(systemd-analyze verify /usr/lib/systemd/system/vmgate.service 2>&1) || fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify warns: $out"
dpkg --purge vmgate
[ ! -e /usr/bin/vmgate ] || fail "dpkg --purge left /usr/bin/vmgate"
echo "install-test: $(basename "$deb") installs, runs, verifies and goes"
