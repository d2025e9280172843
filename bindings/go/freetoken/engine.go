package freetoken

/*
#include <freetoken.h>
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// EngineParams are engine settings; DefaultEngineParams gives the library's defaults.
type EngineParams struct {
	Device     int  // a CUDA ordinal, DeviceAuto or DeviceNone
	CPUThreads int  // 0: one per physical core, less two with a GPU
	PinThreads bool // pin each worker to its own core
}

// DefaultEngineParams returns the library's defaults.
func DefaultEngineParams() EngineParams {
	var p C.ft_engine_params
	C.ft_engine_params_init(&p)
	return EngineParams{Device: int(p.device), CPUThreads: int(p.cpu_threads), PinThreads: bool(p.pin_threads)}
}

// EngineInfo describes what an engine runs on.
type EngineInfo struct {
	Device        int // CUDA device in use, or DeviceNone
	CPUThreads    int
	PhysicalCores int
	CPUISA        string
	DeviceName    string
}

// Engine is the machine context (CPU worker pool, GPU choice). Safe for concurrent use.
type Engine struct {
	h owned[C.ft_engine]
}

// NewEngine creates an engine; params nil means the defaults.
func NewEngine(params *EngineParams) (*Engine, error) {
	var p C.ft_engine_params
	C.ft_engine_params_init(&p)
	if params != nil {
		threads, err := toInt32(params.CPUThreads, "CPUThreads")
		if err != nil {
			return nil, err
		}
		p.device, p.cpu_threads, p.pin_threads = C.int32_t(params.Device), threads, C.bool(params.PinThreads)
	}
	var raw *C.ft_engine
	if err := withErrBuf(func(e *C.char, n C.size_t) C.ft_status { return C.ft_engine_create(&p, &raw, e, n) }); err != nil {
		return nil, err
	}
	e := &Engine{h: owned[C.ft_engine]{raw: raw, what: "the engine"}}
	runtime.SetFinalizer(e, func(e *Engine) { e.Close() })
	return e, nil
}

// Close frees the engine. StatusState if models of it are still open.
func (e *Engine) Close() error {
	if err := e.h.close(func(raw *C.ft_engine) { C.ft_engine_free(raw) }, "model(s)"); err != nil {
		return err
	}
	runtime.SetFinalizer(e, nil)
	return nil
}

// Info reports the engine's device, threads and kernel tier.
func (e *Engine) Info() (info EngineInfo, err error) {
	err = e.h.shared(func(raw *C.ft_engine) error {
		var i C.ft_engine_info
		i.struct_size = C.uint32_t(unsafe.Sizeof(i))
		if err := check(C.ft_engine_get_info(raw, &i), func() string { return C.GoString(C.ft_engine_last_error(raw)) }); err != nil {
			return err
		}
		// device_name lives as long as the engine: copied while the lock holds it open.
		info = EngineInfo{Device: int(i.device), CPUThreads: int(i.cpu_threads), PhysicalCores: int(i.physical_cores),
			CPUISA: C.GoString(i.cpu_isa), DeviceName: C.GoString(i.device_name)}
		return nil
	})
	return info, err
}
