// Package packaging holds what `make install` and `make deb` install beside
// the binaries: the default configuration (vmgate.yaml), the systemd unit
// (vmgate.service.in), the Debian package's nfpm configuration and
// maintainer scripts. It has no code; its test checks that those files
// agree with each other and with what vmgate accepts.
package packaging
