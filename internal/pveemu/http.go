package pveemu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// request is one API call as a handler sees it.
type request struct {
	ctx    context.Context
	method string
	relURI string
	token  *Token
	params map[string]any // URI parameters merged with query and body
}

// The HTTP server side follows pve-http-server (src/PVE/APIServer/AnyEvent.pm,
// Formatter/Standard.pm) and pve-manager's subclass (PVE/HTTPServer.pm).

// maxPost is $limit_max_post of AnyEvent.pm.
const maxPost = 512 * 1024

// apiTokenRE is PVE::APIServer::Formatter::extract_auth_value for the
// "PVEAPIToken" key.
var apiTokenRE = regexp.MustCompile(`(?:^|\s)PVEAPIToken(?:=| )([^;]*)`)

// serveHTTP is PVE::APIServer::AnyEvent::unshift_read_header's request
// handling for /api2/: authentication, body, then handle_api2_request.
func (e *Emulator) serveHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(r.Body, maxPost)
	reqLine := r.Method + " " + r.URL.RequestURI()
	if len(body) > 0 {
		reqLine += "\n" + string(body)
	}
	if err != nil {
		e.plainError(w, reqLine, http.StatusBadRequest, err.Error())
		return
	}
	path, err := url.PathUnescape(r.URL.EscapedPath())
	if err != nil {
		e.plainError(w, reqLine, http.StatusBadRequest, "bad path")
		return
	}
	// split_abs_uri with base /api2/: the format is the first component.
	rest, ok := strings.CutPrefix(path, "/api2/")
	format, rel, _ := strings.Cut(rest, "/")
	if !ok || format == "" {
		e.plainError(w, reqLine, http.StatusNotImplemented, "no such uri")
		return
	}
	rel = "/" + rel
	tok, aerr := e.authenticate(r)
	if aerr != nil {
		// An authentication failure is delayed by 3 seconds and answered
		// with the error as the status line and no body (no login
		// formatter for json).
		select {
		case <-time.After(authFailureDelay):
		case <-r.Context().Done():
		}
		e.plainError(w, reqLine, http.StatusUnauthorized, aerr.msg)
		return
	}
	if format != "json" {
		e.plainError(w, reqLine, http.StatusNotImplemented, "no formatter for uri "+rel+", "+format)
		return
	}
	if len(body) > 0 && r.Method != http.MethodPost && r.Method != http.MethodPut {
		e.plainError(w, reqLine, http.StatusNotImplemented, "Unexpected content for method '"+r.Method+"'")
		return
	}
	if len(body) > maxPost {
		e.plainError(w, reqLine, http.StatusNotImplemented, "for data too large")
		return
	}
	params, perr := extractParams(r, body)
	if perr != nil {
		e.answer(w, reqLine, nil, perr)
		return
	}
	var accept, proto string
	if strings.HasSuffix(rel, "websocket") {
		var upgrade bool
		var werr error
		if accept, proto, upgrade, werr = wsUpgrade(r); werr != nil {
			e.answer(w, reqLine, nil, die("%v", werr))
			return
		} else if !upgrade {
			accept = ""
		}
	}
	data, herr := e.restHandler(&request{ctx: r.Context(), method: r.Method, relURI: rel, token: tok, params: params})
	if accept != "" && herr == nil {
		// websocket_proxy to the port the method answered (websocket.go).
		e.record(reqLine, http.StatusSwitchingProtocols, "Switching Protocols", nil)
		port, _ := strconv.Atoi(fmt.Sprint(data.(map[string]any)["port"]))
		e.websocketProxy(w, accept, proto, port)
		return
	}
	e.answer(w, reqLine, data, herr)
}

// authenticate is PVE::HTTPServer::auth_handler with an API token
// (PVE::AccessControl::verify_token): "No ticket" without credentials,
// "Authentication failed!" for any bad token.
func (e *Emulator) authenticate(r *http.Request) (*Token, *apiError) {
	m := apiTokenRE.FindStringSubmatch(r.Header.Get("Authorization"))
	if m == nil || m[1] == "" {
		return nil, die("No ticket")
	}
	value, err := url.PathUnescape(m[1])
	if err != nil {
		value = m[1]
	}
	// verify_token: /^(.*)=(.*)$/ (the secret follows the last '=').
	i := strings.LastIndexByte(value, '=')
	if i < 0 {
		return nil, die("Authentication failed!")
	}
	id, secret := value[:i], value[i+1:]
	e.mu.Lock()
	tok := e.tokens[id]
	e.mu.Unlock()
	if tok == nil || !tokenFullRE.MatchString(id) || secret != tok.Secret {
		return nil, die("Authentication failed!")
	}
	return tok, nil
}

// extractParams is AnyEvent.pm's extract_params: a POST or PUT body as JSON
// (Content-Type application/json) or urlencoded, then the query parameters.
func extractParams(r *http.Request, body []byte) (map[string]any, *apiError) {
	params := map[string]any{}
	if r.Method == http.MethodPost || r.Method == http.MethodPut {
		ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if ct == "application/json" {
			if len(bytes.TrimSpace(body)) > 0 {
				dec := json.NewDecoder(bytes.NewReader(body))
				dec.UseNumber()
				var m map[string]any
				if err := dec.Decode(&m); err != nil {
					return nil, die("malformed JSON string: %v", err)
				}
				for k, v := range m {
					params[k] = v
				}
			}
		} else {
			decodeURLEncoded(string(body), params)
		}
	}
	decodeURLEncoded(r.URL.RawQuery, params)
	delete(params, "_dc")
	return params, nil
}

// decodeURLEncoded is AnyEvent.pm's decode_urlencoded: repeated keys become
// an array.
func decodeURLEncoded(data string, into map[string]any) {
	if data == "" {
		return
	}
	for _, kv := range strings.FieldsFunc(data, func(r rune) bool { return r == '&' || r == ';' }) {
		k, v, hasV := strings.Cut(kv, "=")
		k, _ = url.QueryUnescape(k)
		if !hasV {
			into[k] = nil
			continue
		}
		v, _ = url.QueryUnescape(v)
		switch old := into[k].(type) {
		case nil:
			into[k] = v
		case []any:
			into[k] = append(old, v)
		default:
			into[k] = []any{old, v}
		}
	}
}

// answer writes a handler's result: PVE::HTTPServer::rest_handler's
// response, formatted by Formatter/Standard.pm's json formatter.
func (e *Emulator) answer(w http.ResponseWriter, reqLine string, data any, err *apiError) {
	if err != nil && err.bare {
		e.record(reqLine, err.code, err.msg, nil)
		writeBare(w, err.code, err.msg)
		return
	}
	code := http.StatusOK
	body := map[string]any{"data": data}
	reason := "OK"
	if err != nil {
		code = err.code
		if code == 0 {
			code = http.StatusInternalServerError
		}
		body = map[string]any{"data": nil}
		if len(err.errors) > 0 {
			body["errors"] = err.errors
		}
		if e.version.JSONErrorMessage() {
			msg := err.msg
			if msg == "" {
				msg = http.StatusText(code)
			}
			body["message"] = msg
		}
		reason = statusLine(code, err.msg)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // Perl's JSON does not escape <, > and &
	if eerr := enc.Encode(body); eerr != nil {
		code, reason = http.StatusInternalServerError, http.StatusText(http.StatusInternalServerError)
		buf.Reset()
	}
	raw := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	e.record(reqLine, code, reason, raw)
	writeRaw(w, code, reason, "application/json;charset=UTF-8", raw, code < 400)
}

// plainError is PVE::APIServer::AnyEvent::error and the 401 path: the
// message is the status line; the body is the message for error(), empty for
// a refused login.
func (e *Emulator) plainError(w http.ResponseWriter, reqLine string, code int, msg string) {
	reason := statusLine(code, msg)
	var body []byte
	if code != http.StatusUnauthorized {
		body = []byte(msg)
	}
	e.record(reqLine, code, reason, body)
	writeRaw(w, code, reason, "", body, false)
}

// writeRaw writes the status line with Proxmox's reason phrase (net/http
// would write the standard one). Answers with code >= 400 close the
// connection, as AnyEvent.pm's response does.
func writeRaw(w http.ResponseWriter, code int, reason, ctype string, body []byte, keepAlive bool) {
	if !keepAlive && hijack(w, func(buf *bufio.ReadWriter) {
		fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\n", code, reason)
		if ctype != "" {
			fmt.Fprintf(buf, "Content-Type: %s\r\n", ctype)
		}
		fmt.Fprintf(buf, "Server: pve-api-daemon/3.0\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", len(body))
		buf.Write(body)
	}) {
		return
	}
	if ctype != "" {
		w.Header().Set("Content-Type", ctype)
	}
	w.Header().Set("Server", "pve-api-daemon/3.0")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	w.Write(body)
}

// hijack takes w's connection, writes an answer of its own on it with
// write and closes it; false when w cannot be taken.
func hijack(w http.ResponseWriter, write func(*bufio.ReadWriter)) bool {
	hj, ok := w.(http.Hijacker)
	if !ok {
		return false
	}
	conn, buf, err := hj.Hijack()
	if err != nil {
		return true // the connection is gone
	}
	defer conn.Close()
	write(buf)
	buf.Flush()
	return true
}
