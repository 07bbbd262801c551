package pveemu

import (
	"fmt"
	"net/http"
	"strings"
)

// apiError is an exception an API handler raised: a PVE::Exception (code,
// msg, errors) or a plain die (code 0: HTTP 500). PVE::HTTPServer::rest_handler
// (pve-manager PVE/HTTPServer.pm) turns it into the answer.
type apiError struct {
	code   int
	msg    string // as Perl holds it, usually ending in "\n"
	errors map[string]string
	// bare: pveproxy's own answer to a forward that failed (proxyFailure):
	// msg is the status line's reason and there is no body.
	bare bool
}

func (e *apiError) Error() string { return e.msg }

// die is Perl's die "...\n": a plain error, HTTP 500.
func die(format string, args ...any) *apiError {
	return &apiError{msg: fmt.Sprintf(format, args...) + "\n"}
}

// paramExc is PVE::Exception::raise_param_exc (pve-common
// src/PVE/Exception.pm): HTTP 400 with per-parameter errors.
func paramExc(errs map[string]string) *apiError {
	return &apiError{code: http.StatusBadRequest, msg: "Parameter verification failed.\n", errors: errs}
}

// permExc is PVE::Exception::raise_perm_exc: HTTP 403 "Permission check
// failed (WHAT)".
func permExc(what string) *apiError {
	msg := "Permission check failed"
	if what != "" {
		msg += " (" + what + ")"
	}
	return &apiError{code: http.StatusForbidden, msg: msg + "\n"}
}

// taskStatus is what PVE::RESTEnvironment::fork_worker writes as the task's
// last line for an error (chomp, newlines become spaces) and
// PVE::UPID::read_status gives back as exitstatus.
func (e *apiError) taskStatus() string {
	return strings.ReplaceAll(strings.TrimSuffix(e.msg, "\n"), "\n", " ")
}

// statusLine is the reason phrase PVE::APIServer::AnyEvent::response writes:
// the message's first line, or the standard text when that is empty.
func statusLine(code int, msg string) string {
	line, _, _ := strings.Cut(msg, "\n")
	line = strings.TrimRight(line, "\r")
	if line == "" || strings.ContainsAny(line, "\r\n") {
		return http.StatusText(code)
	}
	return line
}
