package stdio

import (
	"errors"
	"sync"
)

// errStdioClosed ends a stdio connection's reading when ServeStdio is on
// its way out: the message read last is dropped.
var errStdioClosed = errors.New("server: stdio: closed")

// stdioCrew serves the messages of one stdio connection on long-lived
// goroutines (members), at most max of them, leader/follower style: one
// member at a time holds the lead and reads; when it has read a call it
// passes the lead to an idle member (or to a new one, while fewer than max
// run) and runs the call itself. So no goroutine wakes between reading a
// call and running it: the member that takes the lead wakes while the
// call runs. When all max members run calls, nobody reads until one of
// them is done, which then takes the lead.
//
// A member keeps the stack a call grew (the gate, mcp-go and a driver call
// are deep), where a goroutine per message grew a fresh one for every call
// (runtime.newstack was an eighth of the CPU of a call).
//
// Concurrency: read is called by the member holding the lead, so by one
// goroutine at a time; it returns the next call to run, or an error that
// ends the reading (io.EOF, a read error, errStdioClosed). run is called
// by the members, at most max at once. start is called once; stop may be
// called any number of times from any goroutine. The crew does not wait
// for its members: the caller counts the calls it lets read return and
// waits for those, because the member holding the lead may be blocked in
// a read that never returns.
type stdioCrew struct {
	read func() ([]byte, error)
	run  func(line []byte)
	max  int
	end  chan error // the error that ended the reading, sent once

	mu      sync.Mutex
	free    sync.Cond // signalled when the lead is free or the crew stops
	leading bool      // a member holds the lead
	idle    int       // members waiting in takeLead
	n       int       // members started
	stopped bool      // stop was called or the reading ended: nobody takes the lead again
}

func newStdioCrew(max int, read func() ([]byte, error), run func(line []byte)) *stdioCrew {
	c := &stdioCrew{read: read, run: run, max: max, end: make(chan error, 1)}
	c.free.L = &c.mu
	return c
}

// start starts the first member, holding the lead.
func (c *stdioCrew) start() {
	c.mu.Lock()
	c.n, c.leading = 1, true
	c.mu.Unlock()
	go c.member(true)
}

// ended receives the error that ended the reading.
func (c *stdioCrew) ended() <-chan error { return c.end }

// member reads while it holds the lead and runs the calls it read, until
// the reading ends or the crew stops; leads says it starts with the lead.
func (c *stdioCrew) member(leads bool) {
	for leads || c.takeLead() {
		leads = false
		line, err := c.read()
		if err != nil {
			c.endReading(err)
			return
		}
		c.passLead()
		c.run(line)
	}
}

// takeLead waits until the lead is free and takes it; false once the crew
// stopped.
func (c *stdioCrew) takeLead() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.idle++
	for c.leading && !c.stopped {
		c.free.Wait()
	}
	c.idle--
	if c.stopped {
		return false
	}
	c.leading = true
	return true
}

// passLead gives the lead to an idle member, to a new one while fewer than
// max run, or else frees it for the first member done with its call.
func (c *stdioCrew) passLead() {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.stopped:
	case c.idle > 0:
		c.leading = false
		c.free.Signal()
	case c.n < c.max:
		c.n++ // the new member holds the lead
		go c.member(true)
	default:
		c.leading = false
	}
}

// endReading stops the crew after the reading ended with err.
func (c *stdioCrew) endReading(err error) {
	c.stop()
	c.end <- err
}

// stop lets no member take the lead again: idle members exit, busy ones
// when their call is done. A member blocked in read exits when it returns.
func (c *stdioCrew) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	c.free.Broadcast()
}

// started is how many members were started.
func (c *stdioCrew) started() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}
