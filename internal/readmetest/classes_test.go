package readmetest

import "testing"

// classes classifies every block of README.md (by "<section> #<n>"). A
// block that runs may still have a part that needs what is absent here; its
// check says which, in the part's name.
var classes = map[string]entry{
	"vmgate #1": {class: absent, has: "make demo", check: checkMakeTargets,
		why: "make test is the whole suite this test belongs to; make demo serves until Ctrl-C on the fixed 127.0.0.1:8707 " +
			"(TestDemo runs its script on a state directory and port of its own); here: both targets exist (make -n)"},
	"Install #1": {class: run, has: "make install", check: checkInstall},
	"Install #2": {class: run, has: "sha256sum", check: checkToken},
	"The demo and your MCP client #1": {class: absent, has: "claude mcp add", check: checkClientCommands,
		why: "Claude Code (claude) and the MCP Inspector (npx fetches it from npm) are not here; " +
			"here: the stdio command after -- runs as make install installs it, the URL is the installed unit's and answers with the header given"},
	"The demo and your MCP client #2": {class: parsed, has: `"command": "/usr/local/bin/vmgate"`, check: checkDesktopStdio},
	"The demo and your MCP client #3": {class: parsed, has: "mcp-remote", check: checkDesktopRemote},
	"The demo and your MCP client #4": {class: run, has: "vmgate call", check: checkCallLines},
	"Policy #1":                       {class: parsed, has: `"hide"`, check: checkPolicyDoc},
	"Policy #2":                       {class: run, has: "vmgate policy check", check: checkPolicyCommands},
	"Policy #3":                       {class: parsed, has: `"max_count"`, check: checkPolicyDoc},
	"Policy #4":                       {class: parsed, has: `"vm_send_keys"`, check: checkPolicyDoc},
	"Configuration #1":                {class: parsed, has: "grants:", check: checkFullConfig},
	"Backends #1":                     {class: parsed, has: "driver: qemu", check: checkConfigFragment},
	"Backends #2":                     {class: parsed, has: "driver: libvirt", check: checkConfigFragment},
	"Backends #3":                     {class: parsed, has: "driver: proxmox", check: checkConfigFragment},
	"Backends #4":                     {class: parsed, has: "driver: virtualbox", check: checkConfigFragment},
	"Backends #5":                     {class: parsed, has: "driver: firecracker", check: checkConfigFragment},
	"VMs on demand #1":                {class: parsed, has: "templates:", check: checkConfigFragment},
	"The lab #1":                      {class: run, has: "lab up", check: checkLab},
	"Vagrant #1": {class: absent, has: "vagrant up", check: checkVagrant,
		why: "vagrant up downloads the debian/bookworm64 box and boots it under KVM (vagrant-libvirt) or VirtualBox; apt-get install needs root " +
			"and the network (scripts/deps.sh installs those packages); here: the packages are there, vagrant validate runs, the Vagrantfile has both providers"},
	"Tightening a policy #1": {class: absent, has: "vmgate policy suggest", check: checkCommandFlags,
		why: "the audit log of a grant ci that worked under a shadow policy, and trial.json, are the reader's own " +
			"(e2e's TestNodeSDKSuggest runs these commands on a real log); here: each subcommand and every flag it uses exist"},
	"Tightening a policy #2": {class: parsed, has: `"kill_process": {`, check: checkSuggestedExcerpt},
	"Tightening a policy #3": {class: absent, has: "$ vmgate policy test --replay", check: checkCommandFlags,
		why: "the output of a replay of TestNodeSDKSuggest's log; here: the command's subcommand and flags exist"},
	"Tightening a policy #4": {class: absent, has: "kill_process", check: checkDiffExcerpt,
		why: "an excerpt of policy diff's output for TestNodeSDKSuggest's policies; here: the tools it names exist"},
	"Running several replicas #1": {class: parsed, has: "sentinel:", check: checkConfigFragment},
	"Running several replicas #2": {class: absent, has: "sentinel monitor", check: checkSentinelConf,
		why: "a Sentinel's configuration for Redis servers at 10.0.0.x; here: its directives name the master the store block configures"},
}

// knownBroken are the parts of README (block id or prose id, " / ", the
// part) that do not work as written yet, with the finding that fixes them.
// Each must still fail; when one passes, remove it.
var knownBroken = map[string]string{}

// proseCheck checks README statements that are not blocks (tables,
// examples in the text).
type proseCheck struct {
	id    string // the section
	check func(*testing.T, *env) []result
}

var prose = []proseCheck{
	{id: "Tools", check: checkTools},
	{id: "The demo and your MCP client", check: checkClientProse},
	{id: "Operating it", check: checkAuditVerify},
}
