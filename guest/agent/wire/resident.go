package wire

import "fmt"

// The resident helper (vmgate-guest serve): its hello, and the jobs it
// runs in the background (`job start|status|list|cancel`, which only the
// resident helper serves: a vmgate-guest process per command ends with
// its command).

// Proto is the version of the resident helper's protocol (guest/mux and
// the commands below); a host refuses a helper that speaks another.
const Proto = 1

// ReasonNoHelper: `vmgate-guest call` found no resident helper to call
// (its reply's Error.Reason; it exits ExitNoHelper). The call was not sent.
const ReasonNoHelper = "no resident helper"

// ExitNoHelper is the exit status of a `vmgate-guest call` that found no
// resident helper.
const ExitNoHelper = 3

// ReasonNotResident: a job command reached a vmgate-guest that is not the
// resident helper (Error.Code CodeRefused).
const ReasonNotResident = "needs the resident helper"

// Hello is what `vmgate-guest hello` answers, and what the resident helper
// answers a connection's hello with.
type Hello struct {
	Proto   int    `json:"proto"`
	Version string `json:"version"`
	GOOS    string `json:"goos"`
	GOARCH  string `json:"goarch"`
	// SHA256 is the hash of the running binary (lowercase hex): what the
	// host pushed, or an older build that still runs.
	SHA256 string `json:"sha256"`
	PID    int    `json:"pid"`
	// Resident is true when the answer comes from `vmgate-guest serve`.
	Resident bool `json:"resident"`
	// StartedAt is when the resident helper started (ms since the epoch).
	StartedAt int64 `json:"started_at,omitempty"`
	// Port is the virtio-serial device it serves ("" without one).
	Port string `json:"port,omitempty"`
	// Jobs is how many of its jobs are running.
	Jobs int `json:"jobs"`
	// Pool is the one-shot pool's state and counts since the helper
	// started (nil without a pool).
	Pool *PoolStats `json:"pool,omitempty"`
	// Threads counts how sandboxed runs got their session's confined
	// thread (nil from a process per command).
	Threads *ThreadStats `json:"threads,omitempty"`
	// StepsUS is the time the named steps of the helper's session creates
	// ("create netns", ...) and one-shot destroys took, in all (µs).
	StepsUS map[string]int64 `json:"steps_us,omitempty"`
}

// ThreadStats counts the resident helper's session threads: kept now,
// made since it started, and the runs that forked from a ready one
// (Ready), waited for one being made ahead (Waited) or made one on their
// own path (Made by a run: OnPath).
type ThreadStats struct {
	Kept   int   `json:"kept"`
	Made   int64 `json:"made"`
	Ready  int64 `json:"ready"`
	Waited int64 `json:"waited"`
	OnPath int64 `json:"on_path"`
	// BuildMS is the time the threads made took to confine themselves,
	// in all.
	BuildMS int64 `json:"build_ms"`
}

// PoolStats counts what the resident helper's one-shot pool did: runs that
// found a ready session (Hits) or had one made for them (Misses), sessions
// it made ahead (Made) and used ones it destroyed (Destroyed), the ready
// sessions now (Ready, of Size) and the used ones waiting for their
// destroy (Pending).
type PoolStats struct {
	Size      int   `json:"size"`
	Ready     int   `json:"ready"`
	Pending   int   `json:"pending"`
	Hits      int64 `json:"hits"`
	Misses    int64 `json:"misses"`
	Made      int64 `json:"made"`
	Destroyed int64 `json:"destroyed"`
	// MakeMS and DestroyMS are the time its makes and destroys took, in
	// all (a make's session thread is BuildMS of ThreadStats).
	MakeMS    int64 `json:"make_ms"`
	DestroyMS int64 `json:"destroy_ms"`
}

// Serving is what `vmgate-guest serve --detach` answers once the helper
// listens (or found one that already did).
type Serving struct {
	PID     int  `json:"pid"`
	Already bool `json:"already"`
}

// Job states.
const (
	JobRunning = "running"
	JobExited  = "exited"
	// JobLost: the helper that ran the job ended while it ran (the job's
	// processes ended with it); its output up to the last record is kept.
	JobLost = "lost"
)

// JobStarted is what `job start` answers.
type JobStarted struct {
	ID        string `json:"id"`
	PID       int    `json:"pid"`
	StartedAt int64  `json:"started_at"` // ms since the epoch
}

// JobOutput is one output stream of a job from a cursor: Data starts at
// stream offset Offset (the bytes before it that the helper's buffer no
// longer held are Dropped), and Next is the cursor for the next call.
type JobOutput struct {
	Data   []byte `json:"data"`
	Offset int64  `json:"offset"`
	Next   int64  `json:"next"`
	// Total is every byte the command wrote to the stream so far.
	Total int64 `json:"total"`
	// Dropped is how many bytes after the cursor asked for were no longer
	// held (the buffer wrapped); DroppedTotal is how many it ever let go.
	Dropped      int64 `json:"dropped"`
	DroppedTotal int64 `json:"dropped_total"`
	// More: the buffer holds more after Next than this answer carried.
	More bool `json:"more,omitempty"`
}

// JobStatus is what `job status` answers (and `job list`, without data).
type JobStatus struct {
	ID        string `json:"id"`
	Session   string `json:"session,omitempty"`
	PID       int    `json:"pid"`
	State     string `json:"state"`
	StartedAt int64  `json:"started_at"`
	EndedAt   int64  `json:"ended_at,omitempty"`
	// ExitCode, Signal, TimedOut, Killed and DurationMS are a run's, once
	// the job is no longer running.
	ExitCode   int   `json:"exit_code"`
	Signal     int   `json:"signal,omitempty"`
	TimedOut   bool  `json:"timed_out,omitempty"`
	Killed     int   `json:"killed,omitempty"`
	DurationMS int64 `json:"duration_ms,omitempty"`
	// Canceled: `job cancel` or the session's destroy ended it.
	Canceled bool      `json:"canceled,omitempty"`
	Stdout   JobOutput `json:"stdout"`
	Stderr   JobOutput `json:"stderr"`
	// LastLine is the last non-empty line either stream wrote (the one
	// written last), for progress reports.
	LastLine string `json:"last_line,omitempty"`
	// Note says why a job is lost, or what ended it.
	Note string `json:"note,omitempty"`
}

// Job limits.
const (
	// MaxJobWaitMS bounds how long `job status --wait-ms` waits for output.
	MaxJobWaitMS = 30 * 1000
	// DefaultJobReadBytes is how much of each stream one status returns
	// unless --max-bytes says otherwise; at most MaxFileReadBytes.
	DefaultJobReadBytes = 1 << 20
)

// ValidateJobID checks a job id: what `job start` answers, 24 lowercase hex digits.
func ValidateJobID(id string) error {
	if len(id) != 24 {
		return fmt.Errorf("job id %q: want 24 lowercase hex digits", id)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return fmt.Errorf("job id %q: want 24 lowercase hex digits", id)
		}
	}
	return nil
}

// Installed is what `vmgate-guest install` answers.
type Installed struct {
	Unit    string `json:"unit"`
	Systemd bool   `json:"systemd"`
	Started bool   `json:"started"`
	Note    string `json:"note,omitempty"`
}
