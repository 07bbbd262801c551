// Package qemu is vmgate's QEMU backend: a QMP transport (Monitor, which
// implements go-qemu's qmp.Monitor with deadlines, id-matched replies of any
// size up to a limit, and non-blocking events) and a hypervisor.Driver that
// drives QEMU VMs through QMP and their guest agent (guest/qga).
package qemu
