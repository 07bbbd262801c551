// Package vboxemu is a VBoxManage emulator rebuilt from VirtualBox's own
// source, for the virtualbox driver's tests (and for later work on
// snapshots, guest properties and clones). It emulates VirtualBox 6.1.38,
// 7.0.18 and 7.1.6; the version is a setting of the emulated host
// (World.Version) and `VBoxManage --version` answers accordingly.
//
// # Sources
//
// Every emulated behaviour names the upstream file and function it follows.
// The sources are VirtualBox's as released (the 6.1.38, 7.0.18 and 7.1.6
// imports of the kaisenlinux/virtualbox mirror): the VBoxManage front end
// (src/VBox/Frontends/VBoxManage: VBoxManage.cpp, VBoxManageHelp.cpp,
// VBoxManageGuestCtrl.cpp, VBoxManageInfo.cpp, VBoxManageList.cpp,
// VBoxManageMisc.cpp, VBoxManageControlVM.cpp, VBoxManageSnapshot.cpp,
// VBoxManageGuestProp.cpp, VBoxManageModifyVM.cpp), the server side of
// Main for machines, clones and extra data (src/VBox/Main/src-server:
// MachineImpl.cpp, MachineImplCloneVM.cpp, VirtualBoxImpl.cpp, with the
// limits of src/VBox/Main/xml/VirtualBox-settings.xsd), the guest control client side of Main
// (src/VBox/Main/src-client: GuestCtrlImpl.cpp, GuestSessionImpl.cpp,
// GuestSessionImplTasks.cpp, GuestProcessImpl.cpp, GuestCtrlPrivate.cpp),
// the host service (src/VBox/HostServices/GuestControl), VBoxService's
// guest side (src/VBox/Additions/common/VBoxService), IPRT
// (src/VBox/Runtime: getopt.cpp, message.cpp, stream.cpp, RTPathAbsEx.cpp),
// the COM glue (src/VBox/Main/glue/errorprint.cpp) and the Linux wrapper
// script (src/VBox/Installer/linux/VBox.sh). Where the emulator needs a
// behaviour of the C library VBoxManage links with, it says so (glibc's
// stdio buffering of stdout).
//
// # The emulated host
//
// The host is a JSON file, vbox.json, next to the emulator's executable
// (a plugin process does not inherit the test's environment, so the file
// is found from the binary's own path). It holds the version, the guest
// accounts, the registered machines with their states, snapshots, guest
// control sessions and switches for failure modes (the COM server down,
// the vboxdrv module missing, the host's guest control service missing).
// Every invocation reads it under a shared lock and writes it back under
// an exclusive one, so concurrent emulator processes see one host, as
// concurrent VBoxManage processes see one VBoxSVC. A machine powered off
// keeps its session locked by its ending VM process for
// World.VMProcessTeardownMS after `controlvm poweroff` returned
// (VBoxHeadless.cpp TrustedMain unlocks it after its event loop, in the
// 6.1.38, 7.0.18 and 7.1.6 imports alike), and unregistervm, modifyvm and
// startvm are refused meanwhile as MachineImpl.cpp refuses them; tests end
// a VM process at will through UpdateWorld. Every invocation
// appends one JSON line (argv, exit code, stdout, stderr) to vbox.log.
//
// # The guest behind it
//
// A machine may be backed by a lab VM: its QEMU guest agent stands in for
// the Guest Additions' VBoxService (processes, files, network) and its QMP
// monitor for the VM process (reset, power, and snapshots: QEMU internal
// snapshots of the lab VM's disk with, when online, its memory and
// devices; restore and start resume the guest there). What cannot be
// reproduced is written down where it is emulated; in short:
//   - qemu-ga returns a process's output only when it has exited, so the
//     output VBoxService would stream arrives at the end (in 64 KiB reads,
//     with VBoxManage's wait loop between them, as gctlRunPumpOutput does).
//   - qemu-ga sets argv[0] to the image path; when VBoxManage asks for a
//     different argv[0], a working directory or environment changes, the
//     emulator runs the image through the guest's busybox (exec -a, cd,
//     env) so the process, its pid and its status are the image's own.
//   - processes run as qemu-ga's user (root), not as the session's user.
//   - a clone's guest is a spare lab VM, not a copy of the source's, and
//     a linked clone shares no disk with its snapshot.
//   - a guest whose qemu-ga blocks guest-exec stands for a guest whose
//     VBoxService runs without its control service (VBoxService
//     --disable-control): the Additions are reported, guest control is not.
package vboxemu
