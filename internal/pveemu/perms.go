package pveemu

import (
	"regexp"
	"sort"
	"strings"
)

// Token is an API token: USER@REALM!NAME with its secret and the ACL
// entries that give it privileges (a privilege-separated token's own ACL;
// the emulator does not model the owning user's ACL separately, so the
// owner is assumed to hold at least the token's privileges).
type Token struct {
	ID     string
	Secret string
	ACL    []ACL
	// Root makes the token act with root@pam's privileges (a token of
	// root@pam without privilege separation).
	Root bool
}

// ACL is one ACL entry for a token: the privileges (one anonymous role) it
// grants on Path, and whether they propagate to the paths below.
type ACL struct {
	Path      string
	Privs     []string
	Propagate bool
}

// tokenFullRE is PVE::AccessControl's $token_full_regex: user_regex @
// realm_regex ! token_subid_regex (pve-access-control
// src/PVE/AccessControl.pm, src/PVE/Auth/Plugin.pm).
var tokenFullRE = regexp.MustCompile(`^(([^\s:/]+)@([A-Za-z][A-Za-z0-9.\-_]+))!([A-Za-z][A-Za-z0-9.\-_]+)$`)

// userOf splits a token id into its user.
func userOf(tokenID string) string {
	m := tokenFullRE.FindStringSubmatch(tokenID)
	if m == nil {
		return ""
	}
	return m[1]
}

// rootPrivileges are the privileges of the Administrator role, which
// root@pam always has (PVE::RPCEnvironment::permissions). A subset: the
// privileges the emulated methods check, per version.
func rootPrivileges(v Version) []string {
	p := []string{"VM.Allocate", "VM.Audit", "VM.Clone", "VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Options", "VM.Console", "VM.Migrate",
		"VM.Monitor", "VM.PowerMgmt", "VM.Snapshot", "VM.Snapshot.Rollback", "Sys.Audit", "Sys.Modify",
		"Datastore.AllocateSpace", "Datastore.Audit", "Pool.Audit", "Permissions.Modify"}
	if v.GuestAgentPrivileges() {
		p = append(p, "VM.GuestAgent.Audit", "VM.GuestAgent.FileRead", "VM.GuestAgent.FileWrite",
			"VM.GuestAgent.FileSystemMgmt", "VM.GuestAgent.Unrestricted")
	}
	return p
}

// splitPath splits an ACL path as PVE::AccessControl::roles does.
func splitPath(path string) []string {
	if path == "/" {
		return []string{""}
	}
	return strings.Split(path, "/")
}

// permissions is PVE::RPCEnvironment::permissions for a token: each
// privilege set on path, mapped to its propagate flag. It follows
// PVE::AccessControl::roles: walking down from "/", an entry on a path
// applies when the path is the one checked or the entry propagates, and a
// deeper entry replaces what the levels above gave.
func (e *Emulator) permissions(tok *Token, path string) map[string]bool {
	if tok.Root {
		out := map[string]bool{}
		for _, p := range rootPrivileges(e.version) {
			out[p] = true
		}
		return out
	}
	var roles map[string]bool
	split := splitPath(path)
	cur := ""
	for i, part := range split {
		final := i == len(split)-1
		if part != "" {
			cur += "/" + part
		}
		at := cur
		if at == "" {
			at = "/"
		}
		var next map[string]bool
		for _, a := range tok.ACL {
			if normPath(a.Path) != at || !(final || a.Propagate) {
				continue
			}
			if next == nil {
				next = map[string]bool{}
			}
			for _, p := range a.Privs {
				next[p] = next[p] || a.Propagate
			}
		}
		if next != nil {
			roles = next
		}
	}
	if roles == nil {
		return map[string]bool{}
	}
	return roles
}

func normPath(p string) string {
	if p == "" || p == "/" {
		return "/"
	}
	return "/" + strings.Trim(p, "/")
}

// check is PVE::RPCEnvironment::check: every privilege, or a 403 naming the
// first missing one.
func (e *Emulator) check(tok *Token, path string, privs ...string) *apiError {
	perm := e.permissions(tok, path)
	for _, p := range privs {
		if _, ok := perm[p]; !ok {
			return permExc(path + ", " + p)
		}
	}
	return nil
}

// checkAny is PVE::RPCEnvironment::check_any: one of the privileges, or a
// 403 naming them all, joined by "|".
func (e *Emulator) checkAny(tok *Token, path string, privs ...string) *apiError {
	perm := e.permissions(tok, path)
	for _, p := range privs {
		if _, ok := perm[p]; ok {
			return nil
		}
	}
	return permExc(path + ", " + strings.Join(privs, "|"))
}

// effectivePermissions is PVE::RPCEnvironment::get_effective_permissions:
// the default top-level paths and every path an ACL names, each with the
// privileges set there, leaving out paths without any.
func (e *Emulator) effectivePermissions(tok *Token) map[string]map[string]bool {
	paths := map[string]bool{"/": true, "/access": true, "/access/groups": true, "/nodes": true,
		"/pool": true, "/sdn": true, "/storage": true, "/vms": true}
	for _, a := range tok.ACL {
		paths[normPath(a.Path)] = true
	}
	out := map[string]map[string]bool{}
	keys := make([]string, 0, len(paths))
	for p := range paths {
		keys = append(keys, p)
	}
	sort.Strings(keys)
	for _, p := range keys {
		if perm := e.permissions(tok, p); len(perm) > 0 {
			out[p] = perm
		}
	}
	return out
}
