package freetoken

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// owned is the C handle of a Go wrapper. Calls use it under the lock (shared or exclusive) and
// close frees it under the exclusive lock, so it is never freed while a call uses it; the
// deferred unlock also keeps the wrapper reachable, so its finalizer cannot run during a call.
type owned[T any] struct {
	mu       sync.RWMutex
	raw      *T
	what     string // "the engine": names the handle in errors
	children int32  // open handles made from this one, counted while this one's lock is held
}

// shared runs f on the handle under the read lock: for handles the C API lets many threads use
// at once (engine, finalized model, profile).
func (o *owned[T]) shared(f func(raw *T) error) error {
	o.mu.RLock()
	defer o.mu.RUnlock()
	if o.raw == nil {
		return closedErr(o.what)
	}
	return f(o.raw)
}

// exclusive runs f on the handle under the write lock: for handles used by one thread at a time
// (session, EP group, model under construction), so concurrent calls wait for each other.
func (o *owned[T]) exclusive(f func(raw *T) error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.raw == nil {
		return closedErr(o.what)
	}
	return f(o.raw)
}

// close frees the handle with free once. While handles made from it are open it frees nothing
// and returns StatusState naming them (kinds: "model(s)", "session(s)").
func (o *owned[T]) close(free func(raw *T), kinds string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if n := atomic.LoadInt32(&o.children); n > 0 {
		return &Error{Status: StatusState, Message: fmt.Sprintf("%s still has %d open %s", o.what, n, kinds)}
	}
	if o.raw != nil {
		free(o.raw)
		o.raw = nil
	}
	return nil
}

func closedErr(what string) error {
	return &Error{Status: StatusState, Message: what + " is closed"}
}
