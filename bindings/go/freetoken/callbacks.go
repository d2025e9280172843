package freetoken

// The C callbacks of the library, exported to C. User data carries a runtime/cgo.Handle; a panic
// in a Go function is recovered here (it must not unwind through C) and re-raised by the caller
// once the library call has returned.

/*
#include <stdint.h>
#include <stdbool.h>
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

//export ftGoProgress
func ftGoProgress(user unsafe.Pointer, phase *C.char, done, total C.uint64_t) (goOn C.bool) {
	p := cgo.Handle(uintptr(user)).Value().(*progress)
	p.mu.Lock()
	defer p.mu.Unlock()
	defer func() {
		if r := recover(); r != nil {
			p.panicked = r
			goOn = false
		}
	}()
	if p.panicked != nil {
		return false
	}
	return C.bool(p.fn(C.GoString(phase), uint64(done), uint64(total)))
}

//export ftGoLog
func ftGoLog(_ unsafe.Pointer, level C.int32_t, message *C.char) {
	logMu.RLock()
	fn := logFn
	logMu.RUnlock()
	if fn == nil {
		return
	}
	defer func() { _ = recover() }() // a panicking log function loses that line only
	fn(int(level), C.GoString(message))
}
