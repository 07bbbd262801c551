package vboxemu

import (
	"encoding/xml"
	"os"
	"path/filepath"
	"time"
)

// The machine's settings file (<name>.vbox, the path showvminfo prints as
// CfgFile) is written after every change of the world, as VBoxSVC saves
// it (Machine::i_saveSettings). The emulator writes the part a client
// reads to learn what VBoxManage does not print: the Machine element with
// its uuid, name and currentSnapshot, and the snapshot tree with each
// snapshot's uuid, name, timeStamp, stateFile and Description
// (Settings.cpp MachineConfigFile::buildMachineXML and buildSnapshotXML;
// ConfigFileBase::stringifyTimestamp). Hardware and the rest are left out.

type xmlVirtualBox struct {
	XMLName xml.Name   `xml:"VirtualBox"`
	Xmlns   string     `xml:"xmlns,attr"`
	Version string     `xml:"version,attr"`
	Machine xmlMachine `xml:"Machine"`
}

type xmlMachine struct {
	UUID            string       `xml:"uuid,attr"`
	Name            string       `xml:"name,attr"`
	CurrentSnapshot string       `xml:"currentSnapshot,attr,omitempty"`
	LastStateChange string       `xml:"lastStateChange,attr"`
	Snapshot        *xmlSnapshot `xml:"Snapshot"`
}

type xmlSnapshot struct {
	UUID        string        `xml:"uuid,attr"`
	Name        string        `xml:"name,attr"`
	TimeStamp   string        `xml:"timeStamp,attr"`
	StateFile   string        `xml:"stateFile,attr,omitempty"`
	Description string        `xml:"Description,omitempty"`
	Children    *xmlSnapshots `xml:"Snapshots,omitempty"`
}

// xmlSnapshots is a Snapshots element: only a snapshot with children
// has one.
type xmlSnapshots struct {
	Snapshot []xmlSnapshot `xml:"Snapshot"`
}

// stringifyTimestamp is ConfigFileBase::stringifyTimestamp: UTC, seconds.
func stringifyTimestamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05Z") }

// writeSettings writes m's settings file at path.
func writeSettings(path string, m *Machine) error {
	doc := xmlVirtualBox{Xmlns: "http://www.virtualbox.org/", Version: "1.19-linux",
		Machine: xmlMachine{UUID: "{" + m.UUID + "}", Name: m.Name, LastStateChange: stringifyTimestamp(m.StateChange)}}
	if m.CurrentSnapshot != "" {
		doc.Machine.CurrentSnapshot = "{" + m.CurrentSnapshot + "}"
	}
	var build func(s *Snapshot) xmlSnapshot
	build = func(s *Snapshot) xmlSnapshot {
		x := xmlSnapshot{UUID: "{" + s.UUID + "}", Name: s.Name, TimeStamp: stringifyTimestamp(s.Taken), Description: s.Description}
		if s.Online {
			// An online snapshot has a saved state file in the machine's
			// Snapshots folder (SessionMachine::takeSnapshot,
			// i_composeSavedStateFilename).
			x.StateFile = "Snapshots/" + s.Taken.UTC().Format("2006-01-02T15-04-05-000000000Z") + ".sav"
		}
		for _, c := range m.children(s.UUID) {
			if x.Children == nil {
				x.Children = &xmlSnapshots{}
			}
			x.Children.Snapshot = append(x.Children.Snapshot, build(c))
		}
		return x
	}
	if r := m.root(); r != nil {
		x := build(r)
		doc.Machine.Snapshot = &x
	}
	raw, err := xml.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append([]byte(xml.Header), raw...), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
