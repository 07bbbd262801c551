package mux

import (
	"errors"
	"io"
	"sync"
)

// errClosed: the connection was closed.
var errClosed = errors.New("mux: connection closed")

// outMsg is a message on its way out, sent one chunk at a time.
type outMsg struct {
	kind  byte
	id    uint32
	data  []byte
	off   int
	epoch uint64
}

// sender owns the writes on one byte stream: control frames first (hello,
// cancel, reject), then one chunk of each pending message in turn, round
// robin, so a large transfer shares the line with every other stream
// instead of holding it. Frames that are ready together go out in one
// write of at most batchBytes.
//
// mu guards everything but w, which only the loop touches. The loop is
// the only writer of w.
type sender struct {
	w io.Writer

	mu      sync.Mutex
	wake    chan struct{} // capacity 1: work was queued
	ctrl    [][]byte      // encoded control frames
	msgs    []*outMsg     // round-robin queue
	epoch   uint64        // messages of an older epoch are dropped unsent
	err     error         // set once: the loop has ended
	stopped chan struct{} // closed when the loop returns
}

// batchBytes bounds one write.
const batchBytes = 64 << 10

func newSender(w io.Writer) *sender {
	s := &sender{w: w, wake: make(chan struct{}, 1), stopped: make(chan struct{})}
	go s.loop()
	return s
}

func (s *sender) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// control queues an encoded control frame ahead of the messages.
func (s *sender) control(enc []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	s.ctrl = append(s.ctrl, enc)
	s.signal()
	return nil
}

// send queues a message of the given epoch.
func (s *sender) send(kind byte, id uint32, data []byte, epoch uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	s.msgs = append(s.msgs, &outMsg{kind: kind, id: id, data: data, epoch: epoch})
	s.signal()
	return nil
}

// newEpoch drops every queued message (the peer that asked for them is
// gone) and makes epoch the current one.
func (s *sender) newEpoch(epoch uint64) {
	s.mu.Lock()
	s.epoch = epoch
	s.msgs = s.msgs[:0]
	s.ctrl = s.ctrl[:0]
	s.mu.Unlock()
}

// drop forgets a queued message of stream id (its caller gave up).
func (s *sender) drop(id uint32) {
	s.mu.Lock()
	for i, m := range s.msgs {
		if m.id == id {
			s.msgs = append(s.msgs[:i], s.msgs[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
}

// close stops the loop after its current write; later sends fail with err.
func (s *sender) close(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.signal()
	s.mu.Unlock()
}

// next builds the next batch into buf; ok is false when the sender is closed.
func (s *sender) next(buf, scratch []byte) (out, raw []byte, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return buf, scratch, false
	}
	for len(s.ctrl) > 0 && len(buf) < batchBytes {
		buf = append(buf, s.ctrl[0]...)
		s.ctrl = s.ctrl[1:]
	}
	for len(s.msgs) > 0 && len(buf) < batchBytes {
		m := s.msgs[0]
		s.msgs = s.msgs[1:]
		if m.epoch != s.epoch {
			continue
		}
		end := min(m.off+ChunkBytes, len(m.data))
		var flags byte
		if end == len(m.data) {
			flags = flagFin
		}
		buf, scratch = appendFrame(buf, scratch, m.kind, flags, m.id, m.data[m.off:end])
		m.off = end
		if flags == 0 {
			s.msgs = append(s.msgs, m)
		}
	}
	return buf, scratch, true
}

func (s *sender) loop() {
	defer close(s.stopped)
	var buf, scratch []byte
	for {
		var ok bool
		buf, scratch, ok = s.next(buf[:0], scratch)
		if !ok {
			return
		}
		if len(buf) == 0 {
			<-s.wake
			continue
		}
		if _, err := s.w.Write(buf); err != nil {
			s.close(err)
			return
		}
		if cap(buf) > 4*batchBytes {
			buf = nil
		}
	}
}
