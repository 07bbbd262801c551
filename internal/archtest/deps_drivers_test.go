package archtest

import (
	"slices"
	"strings"
	"testing"
)

// concreteDriver reports whether rel (relative to the module) is a
// concrete driver package: plugins/NAME or below it, except the drivers'
// shared internals (plugins/internal).
func concreteDriver(rel string) bool {
	name, ok := strings.CutPrefix(rel, "plugins/")
	return ok && name != "" && !within(name, "internal")
}

// driverRules keep the drivers at the edge: each registers itself with
// hypervisor/registry, and the middle of the house finds it there by name.
var driverRules = []depRule{
	{
		name: "config, the plugin host and server import no concrete driver (drivers register themselves)",
		applies: func(pkg string) bool {
			return pkg == "config" || within(pkg, "internal/pluginhost") || within(pkg, "server")
		},
		transitive: true,
		forbidden:  func(dep string, ours bool) bool { return ours && concreteDriver(dep) },
	},
	{
		name:      "only cmd/vmgate links the built-in drivers in (cmd/vmgate/drivers.go)",
		applies:   func(pkg string) bool { return pkg != "cmd/vmgate" && !within(pkg, "plugins") },
		forbidden: func(dep string, ours bool) bool { return ours && concreteDriver(dep) },
	},
}

func TestDriverArrows(t *testing.T) {
	pkgs := listModule(t)
	found, applied := violations(pkgs, driverRules)
	for _, v := range found {
		t.Error(v)
	}
	for _, r := range driverRules {
		if applied[r.name] == 0 {
			t.Errorf("rule %q constrains no package of the module; want at least one", r.name)
		}
	}
}

// TestDriverRulesBite feeds the driver rules graphs that break each one,
// and a clean one shaped like the house.
func TestDriverRulesBite(t *testing.T) {
	m := func(rel string) string { return module + "/" + rel }
	clean := []listedPackage{
		{ImportPath: m("hypervisor/registry"), Imports: []string{m("hypervisor")}, Deps: []string{m("hypervisor")}},
		{ImportPath: m("plugins/qemu"), Imports: []string{m("hypervisor/registry"), m("plugins/internal/agentexec")},
			Deps: []string{m("hypervisor/registry"), m("plugins/internal/agentexec"), m("guest/qga")}},
		{ImportPath: m("plugins/internal/agentexec"), Imports: []string{m("guest/qga")}, Deps: []string{m("guest/qga")}},
		{ImportPath: m("config"), Imports: []string{m("hypervisor/registry")}, Deps: []string{m("hypervisor/registry"), m("hypervisor")}},
		{ImportPath: m("internal/pluginhost"), Imports: []string{m("hypervisor/registry")}, Deps: []string{m("hypervisor/registry")}},
		{ImportPath: m("server"), Imports: []string{m("hypervisor")}, Deps: []string{m("hypervisor")}},
		{ImportPath: m("cmd/vmgate"), Imports: []string{m("config"), m("plugins/qemu"), m("plugins/libvirt")},
			Deps: []string{m("config"), m("plugins/qemu"), m("plugins/libvirt")}},
		// A package that uses the binary's wiring reaches the drivers only transitively.
		{ImportPath: m("e2e"), Imports: []string{m("server")}, Deps: []string{m("server")}},
	}
	tests := []struct {
		name     string
		pkg      listedPackage
		wantRule []string // the rules that must report it, in order
	}{
		{"config imports a driver", listedPackage{ImportPath: m("config"), Imports: []string{m("plugins/proxmox")}, Deps: []string{m("plugins/proxmox")}},
			[]string{driverRules[0].name, driverRules[1].name}},
		{"pluginhost depends on a driver through a helper", listedPackage{ImportPath: m("internal/pluginhost"), Imports: []string{m("internal/drivers")},
			Deps: []string{m("internal/drivers"), m("plugins/qemu")}}, []string{driverRules[0].name}},
		{"a server subpackage imports a driver", listedPackage{ImportPath: m("server/metrics"), Imports: []string{m("plugins/virtualbox")}, Deps: []string{m("plugins/virtualbox")}},
			[]string{driverRules[0].name, driverRules[1].name}},
		{"a built-in table imports the drivers", listedPackage{ImportPath: m("internal/drivers"), Imports: []string{m("plugins/libvirt")}, Deps: []string{m("plugins/libvirt")}},
			[]string{driverRules[1].name}},
		{"a driver's subpackage is a driver", listedPackage{ImportPath: m("internal/lab"), Imports: []string{m("plugins/qemu/qmp")}, Deps: []string{m("plugins/qemu/qmp")}},
			[]string{driverRules[1].name}},
		{"the drivers' internals are no driver", listedPackage{ImportPath: m("internal/x"), Imports: []string{m("plugins/internal/agentexec")}, Deps: []string{m("plugins/internal/agentexec")}}, nil},
		{"a driver may use another package of plugins/", listedPackage{ImportPath: m("plugins/libvirt"), Imports: []string{m("plugins/internal/agentexec")}, Deps: []string{m("plugins/internal/agentexec")}}, nil},
		{"a package named like plugins is not", listedPackage{ImportPath: m("config"), Imports: []string{m("pluginsx/qemu")}, Deps: []string{m("pluginsx/qemu")}}, nil},
	}
	if found, _ := violations(clean, driverRules); len(found) != 0 {
		t.Fatalf("violations(clean graph) = %q; want none", found)
	}
	for _, tt := range tests {
		graph := append(slices.Clone(clean), tt.pkg)
		found, _ := violations(graph, driverRules)
		var got []string
		for _, v := range found {
			rule, _, _ := strings.Cut(v, ": ")
			got = append(got, rule)
		}
		if !slices.Equal(slices.Compact(got), tt.wantRule) {
			t.Errorf("violations(clean + %s) = %q; want rules %q", tt.name, found, tt.wantRule)
		}
	}
}
