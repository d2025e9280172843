package freetoken

// The library's log messages sent to a Go function.

/*
#include <freetoken.h>

extern void ftGoLog(void *user_data, int32_t level, char *message);

static void ft_log_to_go(int32_t level) { ft_log_set_callback((ft_log_fn)ftGoLog, NULL, level); }
*/
import "C"

import (
	"sync"
)

var logMu sync.RWMutex
var logFn func(level int, message string)

// SetLogCallback sends the library's log messages of level or more severe to fn (one line each,
// from any library thread, possibly at once). fn must not call back into the library.
// Process-wide.
func SetLogCallback(level int, fn func(level int, message string)) {
	logMu.Lock()
	logFn = fn
	logMu.Unlock()
	C.ft_log_to_go(C.int32_t(level))
}

// ResetLogCallback sends log messages of level or more severe to standard error again.
func ResetLogCallback(level int) {
	C.ft_log_set_callback(nil, nil, C.int32_t(level))
	logMu.Lock()
	logFn = nil
	logMu.Unlock()
}
