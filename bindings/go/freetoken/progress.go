package freetoken

// Progress callbacks of long library calls (model load, profiling).

/*
#include <freetoken.h>
*/
import "C"

import (
	"runtime/cgo"
	"sync"
)

// ProgressFunc receives (phase, done, total) of a long operation; return false to cancel it.
// It must not Close the engine a load runs on: Close waits for the load, which waits for it.
type ProgressFunc func(phase string, done, total uint64) bool

// progress holds a ProgressFunc, its serialising lock and a recovered panic for the C callback.
type progress struct {
	mu       sync.Mutex
	fn       ProgressFunc
	panicked interface{}
}

// attach registers fn for one library call: set installs the callback with the handle's value;
// the returned function releases the handle and re-raises a panic of fn.
func attachProgress(fn ProgressFunc, set func(h C.uintptr_t)) func() {
	if fn == nil {
		return func() {}
	}
	p := &progress{fn: fn}
	h := cgo.NewHandle(p)
	set(C.uintptr_t(h))
	return func() {
		h.Delete()
		if p.panicked != nil {
			panic(p.panicked)
		}
	}
}
