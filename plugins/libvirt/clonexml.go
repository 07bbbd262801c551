package libvirt

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// The XML of a clone: the template domain's inactive XML, rewritten token
// by token (so everything the driver does not touch stays as libvirt wrote
// it, namespaced metadata and qemu:commandline included):
//
//   - name is the clone's; uuid is dropped (libvirt makes one); memory,
//     currentMemory and vcpu are the request's when it sets them;
//   - every writable file disk gets <transient shareBacking='yes'/>: libvirt
//     puts a qcow2 overlay next to the template's image when the clone
//     starts and deletes it when the clone stops, so the template's image
//     is only ever read, by any number of clones. A disk that is not a
//     file, or is shareable, is refused;
//   - what two domains cannot share is made the clone's own: interface MAC
//     addresses are dropped (libvirt makes new ones), explicit unix socket
//     and file paths of channels, serial and console devices, and their
//     log files, get the clone's name appended, a fixed graphics port becomes autoport, and
//     the NVRAM file is dropped (libvirt makes one from its template);
//   - the metadata gains the lease element that marks the clone
//     (leaseMetadataURI) and, when the driver filters domains by metadata,
//     an element in that namespace so the clone is visible to it.

// leaseMetadataURI is the namespace of the element that marks a created
// domain with its lease id.
const leaseMetadataURI = "urn:vmgate:lease"

// leaseElement is that element's local name.
const leaseElement = "lease"

// cloneSpec is what cloneXML changes.
type cloneSpec struct {
	name     string
	memoryMB int64 // 0: the template's
	cpus     int64 // 0: the template's
	mark     string
	// filterURI, when set, adds an element in that namespace (the driver's
	// metadata filter) unless the template has one.
	filterURI     string
	filterPresent bool
}

// errCloneXML wraps everything cloneXML refuses.
var errCloneXML = errors.New("template domain cannot be cloned")

// cloneXML rewrites the template's XML into the clone's.
func cloneXML(src string, spec cloneSpec) (string, error) {
	r := &cloneRewriter{spec: spec}
	dec := xml.NewDecoder(strings.NewReader(src))
	for {
		tok, err := dec.RawToken()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", fmt.Errorf("%w: its XML: %v", errCloneXML, err)
		}
		if err := r.token(xml.CopyToken(tok)); err != nil {
			return "", err
		}
	}
	switch {
	case len(r.path) > 0:
		return "", fmt.Errorf("%w: its XML ends inside <%s>", errCloneXML, r.path[len(r.path)-1])
	case !r.sawDomain:
		return "", fmt.Errorf("%w: no <domain> element", errCloneXML)
	}
	return r.out.String(), nil
}

// cloneRewriter streams tokens to out, applying the rules above.
type cloneRewriter struct {
	spec      cloneSpec
	out       bytes.Buffer
	path      []string // the names of the open elements
	skip      int      // > 0: inside a dropped element (its depth)
	text      string   // replacement text for the element being written, "" none
	sawDomain bool
	sawMeta   bool
	// disk state while inside /domain/devices/disk.
	disk struct {
		on, file, readonly, transient, shareable bool
		target                                   string
	}
}

func rawName(n xml.Name) string {
	if n.Space != "" {
		return n.Space + ":" + n.Local
	}
	return n.Local
}

func (r *cloneRewriter) at(p string) bool { return strings.Join(r.path, "/") == p }

func attr(e xml.StartElement, name string) (string, bool) {
	for _, a := range e.Attr {
		if rawName(a.Name) == name {
			return a.Value, true
		}
	}
	return "", false
}

func setAttr(e *xml.StartElement, name, value string) {
	for i, a := range e.Attr {
		if rawName(a.Name) == name {
			e.Attr[i].Value = value
			return
		}
	}
	e.Attr = append(e.Attr, xml.Attr{Name: xml.Name{Local: name}, Value: value})
}

func dropAttr(e *xml.StartElement, name string) {
	out := e.Attr[:0]
	for _, a := range e.Attr {
		if rawName(a.Name) != name {
			out = append(out, a)
		}
	}
	e.Attr = out
}

func (r *cloneRewriter) token(tok xml.Token) error {
	switch t := tok.(type) {
	case xml.StartElement:
		r.path = append(r.path, rawName(t.Name))
		if r.skip > 0 {
			return nil
		}
		if drop := r.start(&t); drop {
			r.skip = len(r.path)
			return nil
		}
		writeStart(&r.out, t)
		if r.text != "" {
			r.out.WriteString(escText.Replace(r.text))
		}
	case xml.EndElement:
		defer func() { r.path = r.path[:len(r.path)-1] }()
		if r.skip > 0 {
			if len(r.path) == r.skip {
				r.skip = 0
			}
			return nil
		}
		if err := r.end(); err != nil {
			return err
		}
		r.text = ""
		r.out.WriteString("</" + rawName(t.Name) + ">")
	case xml.CharData:
		if r.skip > 0 {
			return nil
		}
		if r.text != "" {
			return nil // replaced: written by start
		}
		r.out.WriteString(escText.Replace(string(t)))
	case xml.Comment:
		if r.skip == 0 {
			r.out.WriteString("<!--" + string(t) + "-->")
		}
	case xml.ProcInst:
		if r.skip == 0 {
			r.out.WriteString("<?" + t.Target + " " + string(t.Inst) + "?>")
		}
	case xml.Directive:
		return fmt.Errorf("%w: its XML has a directive", errCloneXML)
	}
	return nil
}

// start applies the rules to an opening element (r.text, when set, is the
// element's new text); drop says to leave the element out with everything
// inside it.
func (r *cloneRewriter) start(t *xml.StartElement) (drop bool) {
	r.text = ""
	p := strings.Join(r.path, "/")
	switch {
	case p == "domain":
		r.sawDomain = true
	case p == "domain/uuid", p == "domain/os/nvram", p == "domain/devices/interface/mac":
		return true
	case p == "domain/name":
		r.text = r.spec.name
	case (p == "domain/memory" || p == "domain/currentMemory") && r.spec.memoryMB > 0:
		t.Attr = nil
		setAttr(t, "unit", "MiB")
		r.text = strconv.FormatInt(r.spec.memoryMB, 10)
	case p == "domain/vcpu" && r.spec.cpus > 0:
		dropAttr(t, "current")
		r.text = strconv.FormatInt(r.spec.cpus, 10)
	case p == "domain/metadata":
		r.sawMeta = true
	case p == "domain/devices/disk":
		r.diskStart(*t)
	case strings.HasPrefix(p, "domain/devices/disk/") && r.disk.on && len(r.path) == 4:
		switch r.path[3] {
		case "readonly":
			r.disk.readonly = true
		case "transient":
			r.disk.transient = true
		case "shareable":
			r.disk.shareable = true
		case "target":
			r.disk.target, _ = attr(*t, "dev")
		}
	case p == "domain/devices/graphics":
		if v, _ := attr(*t, "autoport"); v == "no" {
			setAttr(t, "autoport", "yes")
			dropAttr(t, "port")
			dropAttr(t, "tlsPort")
		}
	case len(r.path) == 4 && r.path[3] == "source" && isChardev(r.path[2]):
		if v, ok := attr(*t, "path"); ok && v != "" {
			setAttr(t, "path", v+"."+r.spec.name)
		}
	case len(r.path) == 4 && r.path[3] == "log" && isChardev(r.path[2]):
		// virtlogd holds a chardev's log file open for its domain and
		// refuses a second domain the same file (EBUSY).
		if v, ok := attr(*t, "file"); ok && v != "" {
			setAttr(t, "file", v+"."+r.spec.name)
		}
	}
	return false
}

func (r *cloneRewriter) diskStart(t xml.StartElement) {
	dev, _ := attr(t, "device")
	typ, _ := attr(t, "type")
	r.disk.on = dev == "" || dev == "disk"
	r.disk.file = typ == "file"
	r.disk.readonly, r.disk.transient, r.disk.shareable, r.disk.target = false, false, false, ""
}

// end runs before an element's closing tag is written.
func (r *cloneRewriter) end() error {
	switch {
	case r.at("domain/devices/disk") && r.disk.on:
		r.disk.on = false
		if r.disk.readonly || r.disk.transient {
			return nil
		}
		if !r.disk.file {
			return fmt.Errorf("%w: disk %s is not a file (a clone's disk is an overlay on a file image)", errCloneXML, r.disk.target)
		}
		if r.disk.shareable {
			return fmt.Errorf("%w: disk %s is shareable (an overlay's backing image is read-only)", errCloneXML, r.disk.target)
		}
		r.out.WriteString("<transient shareBacking='yes'/>")
	case r.at("domain/metadata"):
		r.writeMarks()
	case r.at("domain") && !r.sawMeta:
		r.out.WriteString("<metadata>")
		r.writeMarks()
		r.out.WriteString("</metadata>")
	}
	return nil
}

func (r *cloneRewriter) writeMarks() {
	fmt.Fprintf(&r.out, "<vmgate:%s xmlns:vmgate='%s'>%s</vmgate:%s>", leaseElement, leaseMetadataURI, escText.Replace(r.spec.mark), leaseElement)
	if r.spec.filterURI != "" && !r.spec.filterPresent {
		fmt.Fprintf(&r.out, "<vmgatefilter:vm xmlns:vmgatefilter='%s'>created</vmgatefilter:vm>", escAttr.Replace(r.spec.filterURI))
	}
}

// escText escapes character data; escAttr a value in single quotes.
// Whitespace stays as it is.
var (
	escText = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")
	escAttr = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", "'", "&apos;", "\n", "&#xA;", "\r", "&#xD;", "\t", "&#x9;")
)

func writeStart(b *bytes.Buffer, t xml.StartElement) {
	b.WriteString("<" + rawName(t.Name))
	for _, a := range t.Attr {
		b.WriteString(" " + rawName(a.Name) + "='" + escAttr.Replace(a.Value) + "'")
	}
	b.WriteString(">")
}

// isChardev reports whether a device element is a character device whose
// source path and log file are the domain's own.
func isChardev(name string) bool {
	return name == "serial" || name == "console" || name == "channel" || name == "parallel"
}
