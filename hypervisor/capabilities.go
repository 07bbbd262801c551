package hypervisor

// Capabilities says which optional capabilities a driver has, so a caller
// can tell "this backend cannot snapshot" without making a call that fails.
type Capabilities struct {
	// Snapshots: the driver is a Snapshotter; SnapshotModes says which kinds.
	Snapshots     bool          `json:"snapshots"`
	SnapshotModes SnapshotModes `json:"snapshot_modes"`
	// GuestNetwork: the driver is a GuestNetworker.
	GuestNetwork bool `json:"guest_network"`
	// Metrics: the driver is a MetricsReader.
	Metrics bool `json:"metrics"`
	// Create: the driver is a Creator (vm_create, vm_delete).
	Create bool `json:"create"`
	// HelperChannel: the driver is a HelperCaller.
	HelperChannel bool `json:"helper_channel"`
	// Screenshot, SendKeys, ConsoleRead, ConsoleWrite: the driver is a
	// Screener, a KeySender, a ConsoleReader, a ConsoleWriter (screen.go).
	Screenshot   bool `json:"screenshot"`
	SendKeys     bool `json:"send_keys"`
	ConsoleRead  bool `json:"console_read"`
	ConsoleWrite bool `json:"console_write"`
}

// CapabilityReporter is implemented by drivers that implement the
// capability interfaces on behalf of another driver (the plugin client,
// Deferred, the plugin host's supervisor): their methods exist whatever
// the driver behind them can do, so their type says nothing, and
// Capabilities says what the driver behind them has.
type CapabilityReporter interface {
	Capabilities() Capabilities
}

// CapabilitiesOf returns d's capabilities: what d reports when it is a
// CapabilityReporter, otherwise the capability interfaces d implements.
// It does no I/O.
func CapabilitiesOf(d Driver) Capabilities {
	if r, ok := d.(CapabilityReporter); ok {
		return r.Capabilities()
	}
	var c Capabilities
	if s, ok := d.(Snapshotter); ok {
		c.Snapshots, c.SnapshotModes = true, s.SnapshotModes()
	}
	_, c.GuestNetwork = d.(GuestNetworker)
	_, c.Metrics = d.(MetricsReader)
	_, c.Create = d.(Creator)
	_, c.HelperChannel = d.(HelperCaller)
	_, c.Screenshot = d.(Screener)
	_, c.SendKeys = d.(KeySender)
	_, c.ConsoleRead = d.(ConsoleReader)
	_, c.ConsoleWrite = d.(ConsoleWriter)
	return c
}

// AsSnapshotter returns d as a Snapshotter when d has the capability.
func AsSnapshotter(d Driver) (Snapshotter, bool) {
	s, ok := d.(Snapshotter)
	return s, ok && CapabilitiesOf(d).Snapshots
}

// AsGuestNetworker returns d as a GuestNetworker when d has the capability.
func AsGuestNetworker(d Driver) (GuestNetworker, bool) {
	n, ok := d.(GuestNetworker)
	return n, ok && CapabilitiesOf(d).GuestNetwork
}

// AsMetricsReader returns d as a MetricsReader when d has the capability.
func AsMetricsReader(d Driver) (MetricsReader, bool) {
	m, ok := d.(MetricsReader)
	return m, ok && CapabilitiesOf(d).Metrics
}

// AsCreator returns d as a Creator when d has the capability.
func AsCreator(d Driver) (Creator, bool) {
	c, ok := d.(Creator)
	return c, ok && CapabilitiesOf(d).Create
}

// AsScreener returns d as a Screener when d has the capability.
func AsScreener(d Driver) (Screener, bool) {
	s, ok := d.(Screener)
	return s, ok && CapabilitiesOf(d).Screenshot
}

// AsKeySender returns d as a KeySender when d has the capability.
func AsKeySender(d Driver) (KeySender, bool) {
	k, ok := d.(KeySender)
	return k, ok && CapabilitiesOf(d).SendKeys
}

// AsConsoleReader returns d as a ConsoleReader when d has the capability.
func AsConsoleReader(d Driver) (ConsoleReader, bool) {
	r, ok := d.(ConsoleReader)
	return r, ok && CapabilitiesOf(d).ConsoleRead
}

// AsConsoleWriter returns d as a ConsoleWriter when d has the capability.
func AsConsoleWriter(d Driver) (ConsoleWriter, bool) {
	w, ok := d.(ConsoleWriter)
	return w, ok && CapabilitiesOf(d).ConsoleWrite
}
