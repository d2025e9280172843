package freetoken

// Status codes, the Error type and the checks every call makes before and after the library.

/*
#include <freetoken.h>
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"math"
	"unsafe"
)

// Status is a status code of the C API (ft_status). It is an error, so errors.Is(err, status)
// tests an *Error's status.
type Status int32

const (
	StatusOK              Status = C.FT_OK
	StatusInvalidArgument Status = C.FT_ERR_INVALID_ARGUMENT
	StatusOutOfMemory     Status = C.FT_ERR_OUT_OF_MEMORY
	StatusIO              Status = C.FT_ERR_IO
	StatusFormat          Status = C.FT_ERR_FORMAT
	StatusUnsupported     Status = C.FT_ERR_UNSUPPORTED
	StatusNoDevice        Status = C.FT_ERR_NO_DEVICE
	StatusDevice          Status = C.FT_ERR_DEVICE
	StatusDeviceLost      Status = C.FT_ERR_DEVICE_LOST
	StatusTimeout         Status = C.FT_ERR_TIMEOUT
	StatusCancelled       Status = C.FT_ERR_CANCELLED
	StatusNonFinite       Status = C.FT_ERR_NON_FINITE
	StatusState           Status = C.FT_ERR_STATE
	StatusInternal        Status = C.FT_ERR_INTERNAL
)

// String is the library's name for the status ("FT_ERR_FORMAT"; "FT_ERR_UNKNOWN" if unknown).
func (s Status) String() string { return C.GoString(C.ft_status_string(C.ft_status(s))) }

// Error makes a Status usable as an errors.Is target.
func (s Status) Error() string { return s.String() }

// Error is a failed call: the library's status and its error text (or this package's, for a
// check made before calling the library).
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string { return e.Status.String() + ": " + e.Message }

// Is reports whether target is this error's Status, or an *Error with the same Status.
func (e *Error) Is(target error) bool {
	switch t := target.(type) {
	case Status:
		return e.Status == t
	case *Error:
		return e.Status == t.Status
	}
	return false
}

func check(status C.ft_status, text func() string) error {
	if status == C.FT_OK {
		return nil
	}
	msg := text()
	if msg == "" {
		msg = "(no message)"
	}
	return &Error{Status: Status(status), Message: msg}
}

func invalid(format string, args ...interface{}) error {
	return &Error{Status: StatusInvalidArgument, Message: fmt.Sprintf(format, args...)}
}

// withErrBuf runs a creation call with a C buffer for its error text.
func withErrBuf(call func(err *C.char, size C.size_t) C.ft_status) error {
	const n = 512
	buf := (*C.char)(C.calloc(n, 1))
	defer C.free(unsafe.Pointer(buf))
	return check(call(buf, n), func() string { return C.GoString(buf) })
}

// rowsOf is the row count of a [rows, width] array held in a flat slice of n elements.
func rowsOf(n, width int, what string) (int, error) {
	if width <= 0 || n == 0 || n%width != 0 {
		return 0, invalid("%s has %d elements, not a positive multiple of %d", what, n, width)
	}
	return n / width, nil
}

func expectLen(n, want int, what string) error {
	if n != want {
		return invalid("%s has %d elements, the call needs %d", what, n, want)
	}
	return nil
}

func toInt32(v int, what string) (C.int32_t, error) {
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, invalid("%s = %d does not fit the C API's int32_t", what, v)
	}
	return C.int32_t(v), nil
}
