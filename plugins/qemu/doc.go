// Package qemu is vmgate's QEMU backend: a QMP transport (Monitor, which
// implements go-qemu's qmp.Monitor with deadlines, id-matched replies of any
// size up to a limit, and non-blocking events) and a hypervisor.Driver that
// drives QEMU VMs through QMP and their guest agent (guest/qga), and
// reaches vmgate-guest's resident helper over its virtio-serial port
// (helper.go), dropping that channel's connection when QEMU reports that
// the guest closed the port (helperwatch.go, over a QMP monitor of the
// driver's own).
package qemu
