package tools

import (
	"slices"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/server/catalog"
)

// The sandbox argument of create_session and vm_agent_exec, and the
// policy's answer to it as vmgate-guest takes it.

// sandboxField is create_session's sandbox argument. Only its shape is
// checked here (known fields, modes, absolute clean paths, at most
// wire.MaxSandboxPaths of them); whether it is within the policy's is the
// policy's decision (policy/sandbox.go), and whether a path is a symlink
// the guest's (it refuses one).
func sandboxField() catalog.Field {
	paths := func(name, desc string) catalog.Field {
		return catalog.Field{Name: name, Kind: catalog.KindStringArray, Desc: desc, MaxLen: wire.MaxSandboxPaths, AllowEmpty: true, Valid: wire.ValidateSandboxPath}
	}
	return catalog.Field{Name: "sandbox", Kind: catalog.KindObject,
		Desc: "How the session's processes are confined; a field left out gets the loosest value the policy allows. " +
			"Asking for more than the policy allows is denied, naming what was too loose.",
		Fields: []catalog.Field{
			{Name: "net", Kind: catalog.KindString, Enum: []string{"none", "loopback", "host"},
				Desc: "none: a network namespace with only its own loopback; loopback is enforced as none (a stock kernel cannot share the guest's loopback alone); host: the guest's network."},
			{Name: "user", Kind: catalog.KindString, Enum: []string{"session", "root"},
				Desc: "session: an unprivileged uid and gid of the session's own, no capabilities; root: root, unconfined by uid."},
			{Name: "fs", Kind: catalog.KindObject, Desc: "Extra paths beyond the system directories (read) and the session's own directories (write).",
				Fields: []catalog.Field{
					paths("read", "Absolute paths the session may also read and execute (no symlinks)."),
					paths("write", "Absolute paths the session may also write (no symlinks)."),
				}},
		}}
}

// execSandboxField is vm_agent_exec's sandbox: create_session's, for one
// command in a session of its own.
func execSandboxField() catalog.Field {
	f := sandboxField()
	f.Desc = "Run the command alone in a sandbox of its own (as create_session's sandbox; not with session), made for it and " +
		"destroyed with every process it left once it ends. A field left out gets the loosest value the policy allows; " +
		"a policy may require a sandbox, and then a command without one runs in the policy's."
	return f
}

// sandboxArg is a sandbox argument (sandboxField) as a call gave it.
type sandboxArg struct {
	Net  *string `arg:"net"`
	User *string `arg:"user"`
	FS   *struct {
		Read  []string `arg:"read"`
		Write []string `arg:"write"`
	} `arg:"fs"`
}

// wireSandbox is the policy's sandbox for the call as vmgate-guest takes
// it. Every create_session has one (the policy's default at least): a
// call without one is refused, never run unconfined.
func wireSandbox(sb *policy.Sandbox) (*wire.Sandbox, *catalog.Result) {
	if sb == nil {
		r := catalog.Failure(catalog.TagDenied, "the policy gave no sandbox for this session, so it is not created", true)
		return nil, &r
	}
	ws := wire.Sandbox{
		Net: wire.NetMode(sb.Net), User: wire.UserMode(sb.User),
		FS: wire.FSAccess{Read: slices.Clone(sb.Read), Write: slices.Clone(sb.Write)},
	}
	if sb.TCP != nil {
		ws.TCP = &wire.TCPPorts{Bind: slices.Clone(sb.TCP.Bind), Connect: slices.Clone(sb.TCP.Connect)}
	}
	for _, f := range sb.BestEffort {
		ws.BestEffort = append(ws.BestEffort, wire.Feature(f))
	}
	if err := ws.Validate(); err != nil {
		r := catalog.Failure(catalog.TagDenied, "the policy's sandbox cannot be sent to the guest: "+err.Error(), true)
		return nil, &r
	}
	return &ws, nil
}
