// Package servetest holds end-to-end tests of `vmgate serve` with its
// driver plugins: the built binary over stdio, a lab VM behind the qemu
// plugin, the plugin killed mid-call, the server killed with its plugins,
// bad backend settings refused at start, and an external plugin from
// plugin_dir. It has no code outside its tests.
//
// The VM tests follow the lab rule: they skip when qemu-system-x86_64 is
// not on PATH unless VMGATE_REQUIRE_VM is set, in which case they fail.
package servetest
