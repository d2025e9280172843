// Package freetoken is the Go API of libfreetoken, which computes the routed experts of
// Mixture-of-Experts layers whose weights live in host memory.
//
// The handles follow the C API (freetoken.h) and its threading contract: an Engine may be used
// by many goroutines; a Model is built by one goroutine (NewModel, SetExpert, SetRouterBias,
// Finalize) and is read-only and shareable after Finalize or LoadModel; a Session is used by
// one goroutine at a time (its methods lock it, so misuse is serialised rather than unsafe); a
// Profile is read-only. Every handle has Close (idempotent) and a finalizer that frees it if
// Close was not called; Close waits for calls in progress on the handle. A model keeps its
// engine alive and a session its model, and Close on an engine or model with open children
// returns an error with StatusState.
//
// Errors are *Error values carrying the library's Status and message; errors.Is(err,
// freetoken.StatusInvalidArgument) tests the status. Slices are checked against the shapes the
// library reads or writes before each call.
//
// Build: the package links the library through `#cgo pkg-config: freetoken` (put
// PREFIX/lib/pkgconfig on PKG_CONFIG_PATH). Go 1.19 or newer; no dependencies.
package freetoken

/*
#cgo pkg-config: freetoken
#include <freetoken.h>
#include <freetoken_ep.h>
#include <stdlib.h>

// Declared here rather than through freetoken_cuda.h, which needs CUDA's headers; cudaStream_t
// is a pointer, passed as void *.
ft_status ft_decode_cuda(ft_session *session, int32_t layer, int32_t num_tokens, const uint16_t *hidden,
                         const int32_t *expert_ids, const float *expert_weights, uint16_t *out, void *stream);

// Callbacks into Go (callbacks.go); user data carries a runtime/cgo.Handle.
extern bool ftGoProgress(void *user_data, char *phase, uint64_t done, uint64_t total);
extern void ftGoLog(void *user_data, int32_t level, char *message);

static void ft_set_load_progress(ft_model_load_params *p, uintptr_t h) {
    p->progress = (ft_progress_fn)ftGoProgress;
    p->progress_user_data = (void *)h;
}
static void ft_log_to_go(int32_t level) { ft_log_set_callback((ft_log_fn)ftGoLog, NULL, level); }
static ft_status ft_decode_cuda_u(ft_session *s, int32_t layer, int32_t n, uintptr_t hidden, uintptr_t ids,
                                  uintptr_t weights, uintptr_t out, uintptr_t stream) {
    return ft_decode_cuda(s, layer, n, (const uint16_t *)hidden, (const int32_t *)ids, (const float *)weights,
                          (uint16_t *)out, (void *)stream);
}
*/
import "C"

import (
	"fmt"
	"math"
	"runtime"
	"runtime/cgo"
	"sync"
	"sync/atomic"
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

// BF16 is a bfloat16 value as its 16-bit pattern.
type BF16 uint16

// BF16FromFloat32 rounds to the nearest bf16, ties to even; NaN stays NaN.
func BF16FromFloat32(f float32) BF16 {
	u := math.Float32bits(f)
	if f != f {
		return BF16(u>>16) | 0x0040
	}
	return BF16((u + 0x7fff + ((u >> 16) & 1)) >> 16)
}

// Float32 is the exact value.
func (b BF16) Float32() float32 { return math.Float32frombits(uint32(b) << 16) }

// Version is the loaded library's version ("MAJOR.MINOR.PATCH") and number
// (MAJOR*10000 + MINOR*100 + PATCH).
func Version() (string, uint32) {
	return C.GoString(C.ft_version_string()), uint32(C.ft_version_number())
}

// Expert formats, routing rules, activations, backends, projections, tensor kinds, dtypes and
// log levels of the C API.
const (
	FormatBF16     = int(C.FT_FORMAT_BF16)
	FormatFP8Block = int(C.FT_FORMAT_FP8_BLOCK)
	FormatNVFP4    = int(C.FT_FORMAT_NVFP4)
	FormatMXFP4    = int(C.FT_FORMAT_MXFP4)
	FormatDSFP4    = int(C.FT_FORMAT_DS_FP4)
	FormatQ4_0     = int(C.FT_FORMAT_Q4_0)

	RoutingSoftmaxTopK           = int(C.FT_ROUTING_SOFTMAX_TOPK)
	RoutingSoftmaxTopKRenorm     = int(C.FT_ROUTING_SOFTMAX_TOPK_RENORM)
	RoutingSigmoidGroupTopK      = int(C.FT_ROUTING_SIGMOID_GROUP_TOPK)
	RoutingTopKSoftmax           = int(C.FT_ROUTING_TOPK_SOFTMAX)
	RoutingSqrtSoftplusGroupTopK = int(C.FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK)
	ActivationSiLU               = int(C.FT_ACT_SILU)
	ActivationGELU               = int(C.FT_ACT_GELU)
	ActivationGELUTanh           = int(C.FT_ACT_GELU_TANH)
	ActivationSwiGLUClamp        = int(C.FT_ACT_SWIGLU_CLAMP)
	BackendAuto                  = int(C.FT_BACKEND_AUTO)
	BackendCPU                   = int(C.FT_BACKEND_CPU)
	BackendGPU                   = int(C.FT_BACKEND_GPU)
	BackendOffload               = int(C.FT_BACKEND_OFFLOAD)
	BackendHybrid                = int(C.FT_BACKEND_HYBRID)
	ProjGate                     = int(C.FT_PROJ_GATE)
	ProjUp                       = int(C.FT_PROJ_UP)
	ProjDown                     = int(C.FT_PROJ_DOWN)
	TensorRouterWeight           = int(C.FT_TENSOR_ROUTER_WEIGHT)
	TensorRouterBias             = int(C.FT_TENSOR_ROUTER_BIAS)
	TensorSharedGate             = int(C.FT_TENSOR_SHARED_GATE)
	TensorSharedUp               = int(C.FT_TENSOR_SHARED_UP)
	TensorSharedDown             = int(C.FT_TENSOR_SHARED_DOWN)
	TensorSharedGateProj         = int(C.FT_TENSOR_SHARED_GATE_PROJ)
	DtypeBF16                    = int(C.FT_DTYPE_BF16)
	DtypeF32                     = int(C.FT_DTYPE_F32)
	LogOff                       = int(C.FT_LOG_OFF)
	LogError                     = int(C.FT_LOG_ERROR)
	LogWarn                      = int(C.FT_LOG_WARN)
	LogInfo                      = int(C.FT_LOG_INFO)
	LogDebug                     = int(C.FT_LOG_DEBUG)
	DeviceAuto                   = int(C.FT_DEVICE_AUTO) // the first usable CUDA device, else none
	DeviceNone                   = int(C.FT_DEVICE_NONE) // never touch a GPU
)

// ---- logging ------------------------------------------------------------------------------

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

// ---- progress -----------------------------------------------------------------------------

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

// ---- engine -------------------------------------------------------------------------------

// EngineParams are engine settings; DefaultEngineParams gives the library's defaults.
type EngineParams struct {
	Device     int  // a CUDA ordinal, DeviceAuto or DeviceNone
	CPUThreads int  // 0: one per physical core, less one with a GPU
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

// ---- model --------------------------------------------------------------------------------

// ModelDesc is the geometry of a model built from memory; DefaultModelDesc gives the library's
// defaults (the five sizes must be set).
type ModelDesc struct {
	NumLayers, NumExperts, TopK, HiddenSize, IntermediateSize int
	Format, Activation, Routing                               int
	SwigluAlpha, SwigluLimit                                  float32
	NumGroups, TopKGroups                                     int
	RoutedScalingFactor                                       float32
	Renormalize                                               bool
}

// DefaultModelDesc returns the library's defaults.
func DefaultModelDesc() ModelDesc {
	var d C.ft_model_desc
	C.ft_model_desc_init(&d)
	return ModelDesc{Format: int(d.format), Activation: int(d.activation), Routing: int(d.routing),
		SwigluAlpha: float32(d.swiglu_alpha), SwigluLimit: float32(d.swiglu_limit), NumGroups: int(d.num_groups),
		TopKGroups: int(d.topk_groups), RoutedScalingFactor: float32(d.routed_scaling_factor), Renormalize: bool(d.renormalize)}
}

// ModelInfo is a model's geometry and sizes.
type ModelInfo struct {
	NumLayers, NumExperts, TopK, HiddenSize, IntermediateSize int
	Format, Activation, Routing, NumGroups, TopKGroups        int
	RoutedScalingFactor, SwigluAlpha, SwigluLimit             float32
	FirstMoeLayer, TotalLayers, SharedIntermediateSize        int
	ExpertBytes, BankBytes, PinnedBytes                       uint64
	Architecture                                              string
}

// Model holds expert weights in host banks. Built by one goroutine until Finalize; read-only and
// shareable afterwards (and when made by LoadModel).
type Model struct {
	h      owned[C.ft_model]
	engine *Engine
	info   ModelInfo
}

// newModel wraps a model just made from engine; called under engine's lock, so the engine cannot
// be closed before it counts the model.
func newModel(engine *Engine, raw *C.ft_model) *Model {
	m := &Model{h: owned[C.ft_model]{raw: raw, what: "the model"}, engine: engine}
	atomic.AddInt32(&engine.h.children, 1)
	m.info = modelInfo(raw)
	runtime.SetFinalizer(m, func(m *Model) { m.Close() })
	return m
}

func modelInfo(raw *C.ft_model) ModelInfo {
	var i C.ft_model_info
	i.struct_size = C.uint32_t(unsafe.Sizeof(i))
	C.ft_model_get_info(raw, &i)
	return ModelInfo{NumLayers: int(i.num_layers), NumExperts: int(i.num_experts), TopK: int(i.top_k),
		HiddenSize: int(i.hidden_size), IntermediateSize: int(i.intermediate_size), Format: int(i.format),
		Activation: int(i.activation), Routing: int(i.routing), NumGroups: int(i.num_groups), TopKGroups: int(i.topk_groups),
		RoutedScalingFactor: float32(i.routed_scaling_factor), SwigluAlpha: float32(i.swiglu_alpha),
		SwigluLimit: float32(i.swiglu_limit), FirstMoeLayer: int(i.first_moe_layer), TotalLayers: int(i.total_layers),
		SharedIntermediateSize: int(i.shared_intermediate_size), ExpertBytes: uint64(i.expert_bytes),
		BankBytes: uint64(i.bank_bytes), PinnedBytes: uint64(i.pinned_bytes), Architecture: C.GoString(i.architecture)}
}

// Close frees the model. StatusState if sessions of it are still open.
func (m *Model) Close() error {
	err := m.h.close(func(raw *C.ft_model) {
		C.ft_model_free(raw)
		atomic.AddInt32(&m.engine.h.children, -1)
	}, "session(s)")
	if err != nil {
		return err
	}
	runtime.SetFinalizer(m, nil)
	return nil
}

// NewModel creates an empty model to fill with SetExpert and make usable with Finalize.
func NewModel(engine *Engine, desc ModelDesc) (*Model, error) {
	var d C.ft_model_desc
	C.ft_model_desc_init(&d)
	ints := []struct {
		dst  *C.int32_t
		v    int
		name string
	}{{&d.num_layers, desc.NumLayers, "NumLayers"}, {&d.num_experts, desc.NumExperts, "NumExperts"},
		{&d.top_k, desc.TopK, "TopK"}, {&d.hidden_size, desc.HiddenSize, "HiddenSize"},
		{&d.intermediate_size, desc.IntermediateSize, "IntermediateSize"}, {&d.format, desc.Format, "Format"},
		{&d.activation, desc.Activation, "Activation"}, {&d.routing, desc.Routing, "Routing"},
		{&d.num_groups, desc.NumGroups, "NumGroups"}, {&d.topk_groups, desc.TopKGroups, "TopKGroups"}}
	for _, f := range ints {
		v, err := toInt32(f.v, f.name)
		if err != nil {
			return nil, err
		}
		*f.dst = v
	}
	d.swiglu_alpha, d.swiglu_limit = C.float(desc.SwigluAlpha), C.float(desc.SwigluLimit)
	d.routed_scaling_factor, d.renormalize = C.float(desc.RoutedScalingFactor), C.bool(desc.Renormalize)
	var m *Model
	err := engine.h.shared(func(eraw *C.ft_engine) error {
		var raw *C.ft_model
		if err := withErrBuf(func(e *C.char, n C.size_t) C.ft_status { return C.ft_model_create(eraw, &d, &raw, e, n) }); err != nil {
			return err
		}
		m = newModel(engine, raw)
		return nil
	})
	return m, err
}

// LoadOptions are options of LoadModel.
type LoadOptions struct {
	IOThreads int          // parallel readers; 0: the engine's worker count
	Progress  ProgressFunc // optional: ("load", bytes done, bytes total); false cancels
}

// LoadModel loads the routed experts of a Hugging Face checkpoint directory or a GGUF file.
// opts may be nil.
func LoadModel(engine *Engine, path string, opts *LoadOptions) (*Model, error) {
	var p C.ft_model_load_params
	C.ft_model_load_params_init(&p)
	var fn ProgressFunc
	if opts != nil {
		var err error
		if p.io_threads, err = toInt32(opts.IOThreads, "IOThreads"); err != nil {
			return nil, err
		}
		fn = opts.Progress
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var m *Model
	err := engine.h.shared(func(eraw *C.ft_engine) error {
		done := attachProgress(fn, func(h C.uintptr_t) { C.ft_set_load_progress(&p, h) })
		var raw *C.ft_model
		err := withErrBuf(func(e *C.char, n C.size_t) C.ft_status { return C.ft_model_load(eraw, cpath, &p, &raw, e, n) })
		done()
		if err != nil {
			return err
		}
		m = newModel(engine, raw)
		return nil
	})
	return m, err
}

// build runs a construction call (SetExpert, SetRouterBias, Finalize) under the model's
// exclusive lock and turns its status into an error with the model's text.
func (m *Model) build(f func(raw *C.ft_model) C.ft_status) error {
	return m.h.exclusive(func(raw *C.ft_model) error {
		return check(f(raw), func() string { return C.GoString(C.ft_model_last_error(raw)) })
	})
}

// SetExpert copies one projection of one expert: bf16 [I, H] for ProjGate and ProjUp, [H, I] for
// ProjDown. Only before Finalize.
func (m *Model) SetExpert(layer, expert, proj int, weights []BF16) error {
	if err := expectLen(len(weights), m.info.HiddenSize*m.info.IntermediateSize, "the expert projection"); err != nil {
		return err
	}
	return m.build(func(raw *C.ft_model) C.ft_status {
		return C.ft_model_set_expert(raw, C.int32_t(layer), C.int32_t(expert), C.int32_t(proj),
			unsafe.Pointer(&weights[0]), C.size_t(len(weights)*2))
	})
}

// SetRouterBias sets the routing correction bias of a layer ([E] floats). Only before Finalize.
func (m *Model) SetRouterBias(layer int, bias []float32) error {
	if err := expectLen(len(bias), m.info.NumExperts, "the router bias"); err != nil {
		return err
	}
	return m.build(func(raw *C.ft_model) C.ft_status {
		return C.ft_model_set_router_bias(raw, C.int32_t(layer), (*C.float)(&bias[0]), C.int32_t(len(bias)))
	})
}

// Finalize checks that every projection was set and makes the model read-only.
func (m *Model) Finalize() error {
	return m.h.exclusive(func(raw *C.ft_model) error {
		if err := check(C.ft_model_finalize(raw), func() string { return C.GoString(C.ft_model_last_error(raw)) }); err != nil {
			return err
		}
		m.info = modelInfo(raw)
		return nil
	})
}

// Info returns the model's geometry and sizes.
func (m *Model) Info() ModelInfo { return m.info }

// MoeLayer is the MoE layer index of checkpoint layer modelLayer, or -1 for a dense layer.
func (m *Model) MoeLayer(modelLayer int) int {
	l := -1
	m.h.shared(func(raw *C.ft_model) error {
		l = int(C.ft_model_moe_layer(raw, C.int32_t(modelLayer)))
		return nil
	})
	return l
}

// Tensor is a copy of one of a loaded model's tensors (router weights, shared experts).
type Tensor struct {
	Dtype int
	Shape []int64
	Data  []byte // row-major
}

// Tensor copies tensor kind of MoE layer layer. StatusUnsupported if the model has none.
func (m *Model) Tensor(layer, kind int) (t Tensor, err error) {
	err = m.h.shared(func(raw *C.ft_model) error {
		var v C.ft_tensor_view
		v.struct_size = C.uint32_t(unsafe.Sizeof(v))
		s := C.ft_model_tensor(raw, C.int32_t(layer), C.int32_t(kind), &v)
		// The shared model keeps no error text for this call; the message is made here.
		if err := check(s, func() string { return fmt.Sprintf("tensor %d of MoE layer %d: %s", kind, layer, Status(s)) }); err != nil {
			return err
		}
		t.Dtype = int(v.dtype)
		for d := 0; d < int(v.ndim) && d < 4; d++ {
			t.Shape = append(t.Shape, int64(v.shape[d]))
		}
		// The view lives as long as the model: copied while the lock holds it open.
		t.Data = C.GoBytes(v.data, C.int(v.nbytes))
		return nil
	})
	return t, err
}

// ---- session ------------------------------------------------------------------------------

// SessionParams are session settings; DefaultSessionParams gives the library's defaults.
type SessionParams struct {
	Backend               int
	MaxTokens             int
	SharedExperts         bool
	CheckFinite           bool
	CacheSlots            int64
	CacheFraction         float64
	VramReserveBytes      uint64
	PrefillMinTokens      int
	HybridFraction        float32
	HybridAdaptive        bool
	HandoffTimeoutSeconds float64
}

// DefaultSessionParams returns the library's defaults.
func DefaultSessionParams() SessionParams {
	var p C.ft_session_params
	C.ft_session_params_init(&p)
	return SessionParams{Backend: int(p.backend), MaxTokens: int(p.max_tokens), SharedExperts: bool(p.shared_experts),
		CheckFinite: bool(p.check_finite), CacheSlots: int64(p.cache_slots), CacheFraction: float64(p.cache_fraction),
		VramReserveBytes: uint64(p.vram_reserve_bytes), PrefillMinTokens: int(p.prefill_min_tokens),
		HybridFraction: float32(p.hybrid_fraction), HybridAdaptive: bool(p.hybrid_adaptive),
		HandoffTimeoutSeconds: float64(p.handoff_timeout_seconds)}
}

// SessionStats are a session's counters since creation or the last reset.
type SessionStats struct {
	DecodeCalls, Tokens, RoutesCPU, RoutesSkipped, ExpertsCPU, CPUBytes uint64
	CPUSeconds                                                          float64
	RoutesGPU, CacheHits, CacheMisses, FetchedExperts, FetchedBytes     uint64
	PrefillCalls, PrefillBytes                                          uint64
	HybridFraction, HybridGPUSeconds                                    float64
	HybridTimedSteps                                                    uint64
}

// LayerStats are one MoE layer's slot cache figures.
type LayerStats struct {
	Calls, ActiveExperts, Misses, FetchedExperts, FetchedBytes uint64
}

// Session decodes MoE layers of one model. Used by one goroutine at a time; its methods hold a
// lock, so concurrent calls wait for each other.
type Session struct {
	h      owned[C.ft_session]
	model  *Model
	e, k   int // experts and top-k of the model
	hidden int
}

// NewSession creates a session of model; params nil means the defaults.
func NewSession(model *Model, params *SessionParams) (*Session, error) {
	var p C.ft_session_params
	C.ft_session_params_init(&p)
	if params != nil {
		maxTokens, err := toInt32(params.MaxTokens, "MaxTokens")
		if err != nil {
			return nil, err
		}
		prefill, err := toInt32(params.PrefillMinTokens, "PrefillMinTokens")
		if err != nil {
			return nil, err
		}
		p.backend, p.max_tokens, p.shared_experts = C.int32_t(params.Backend), maxTokens, C.bool(params.SharedExperts)
		p.check_finite, p.cache_slots = C.bool(params.CheckFinite), C.int64_t(params.CacheSlots)
		p.cache_fraction, p.vram_reserve_bytes = C.double(params.CacheFraction), C.uint64_t(params.VramReserveBytes)
		p.prefill_min_tokens, p.hybrid_fraction = prefill, C.float(params.HybridFraction)
		p.hybrid_adaptive, p.handoff_timeout_seconds = C.bool(params.HybridAdaptive), C.double(params.HandoffTimeoutSeconds)
	}
	var s *Session
	err := model.h.shared(func(mraw *C.ft_model) error {
		var raw *C.ft_session
		if err := withErrBuf(func(e *C.char, n C.size_t) C.ft_status { return C.ft_session_create(mraw, &p, &raw, e, n) }); err != nil {
			return err
		}
		s = &Session{h: owned[C.ft_session]{raw: raw, what: "the session"}, model: model,
			e: model.info.NumExperts, k: model.info.TopK, hidden: model.info.HiddenSize}
		// Counted under the model's lock, so the model cannot be closed before it sees the session.
		atomic.AddInt32(&model.h.children, 1)
		runtime.SetFinalizer(s, func(s *Session) { s.Close() })
		return nil
	})
	return s, err
}

// Close frees the session.
func (s *Session) Close() error {
	s.h.close(func(raw *C.ft_session) {
		C.ft_session_free(raw)
		atomic.AddInt32(&s.model.h.children, -1)
	}, "")
	runtime.SetFinalizer(s, nil)
	return nil
}

// call runs f with the session's handle under its exclusive lock and turns the status into an
// error.
func (s *Session) call(f func(raw *C.ft_session) C.ft_status) error {
	return s.h.exclusive(func(raw *C.ft_session) error {
		return check(f(raw), func() string { return C.GoString(C.ft_session_last_error(raw)) })
	})
}

// Backend is the backend the session runs (BackendAuto resolved).
func (s *Session) Backend() int {
	b := 0
	s.call(func(raw *C.ft_session) C.ft_status { b = int(C.ft_session_backend(raw)); return C.FT_OK })
	return b
}

// BackendReason says why the session runs its backend.
func (s *Session) BackendReason() string {
	r := ""
	s.call(func(raw *C.ft_session) C.ft_status { r = C.GoString(C.ft_session_backend_reason(raw)); return C.FT_OK })
	return r
}

// Route turns router logits [T, E] into expert ids and weights [T, K] by the model's rule.
func (s *Session) Route(layer int, logits []float32, ids []int32, weights []float32) error {
	t, err := rowsOf(len(logits), s.e, "logits")
	if err != nil {
		return err
	}
	if err := expectLen(len(ids), t*s.k, "ids"); err != nil {
		return err
	}
	if err := expectLen(len(weights), t*s.k, "weights"); err != nil {
		return err
	}
	tokens, err := toInt32(t, "tokens")
	if err != nil {
		return err
	}
	return s.call(func(raw *C.ft_session) C.ft_status {
		return C.ft_route(raw, C.int32_t(layer), tokens, (*C.float)(&logits[0]), (*C.int32_t)(&ids[0]), (*C.float)(&weights[0]))
	})
}

// Decode computes one MoE layer: hidden [T, H] bf16, ids and weights [T, K] -> out [T, H] bf16.
func (s *Session) Decode(layer int, hidden []BF16, ids []int32, weights []float32, out []BF16) error {
	t, err := rowsOf(len(hidden), s.hidden, "hidden")
	if err != nil {
		return err
	}
	if err := expectLen(len(ids), t*s.k, "ids"); err != nil {
		return err
	}
	if err := expectLen(len(weights), t*s.k, "weights"); err != nil {
		return err
	}
	if err := expectLen(len(out), len(hidden), "out"); err != nil {
		return err
	}
	tokens, err := toInt32(t, "tokens")
	if err != nil {
		return err
	}
	return s.call(func(raw *C.ft_session) C.ft_status {
		return C.ft_decode(raw, C.int32_t(layer), tokens, (*C.uint16_t)(&hidden[0]), (*C.int32_t)(&ids[0]),
			(*C.float)(&weights[0]), (*C.uint16_t)(&out[0]))
	})
}

// DecodeCUDA is ft_decode_cuda: one MoE layer on device memory (addresses of the engine's GPU:
// hidden and out [tokens, H] bf16, ids and weights [tokens, K]), enqueued on stream (a
// cudaStream_t; 0 is the legacy default stream) without waiting. The caller keeps the buffers
// alive and unchanged until the stream has passed the call.
func (s *Session) DecodeCUDA(layer, tokens int, hidden, ids, weights, out, stream uintptr) error {
	n, err := toInt32(tokens, "tokens")
	if err != nil {
		return err
	}
	return s.call(func(raw *C.ft_session) C.ft_status {
		return C.ft_decode_cuda_u(raw, C.int32_t(layer), n, C.uintptr_t(hidden), C.uintptr_t(ids),
			C.uintptr_t(weights), C.uintptr_t(out), C.uintptr_t(stream))
	})
}

// Stats returns the session's counters.
func (s *Session) Stats() (SessionStats, error) {
	var st C.ft_session_stats
	st.struct_size = C.uint32_t(unsafe.Sizeof(st))
	err := s.call(func(raw *C.ft_session) C.ft_status { return C.ft_session_get_stats(raw, &st) })
	return SessionStats{DecodeCalls: uint64(st.decode_calls), Tokens: uint64(st.tokens), RoutesCPU: uint64(st.routes_cpu),
		RoutesSkipped: uint64(st.routes_skipped), ExpertsCPU: uint64(st.experts_cpu), CPUBytes: uint64(st.cpu_bytes),
		CPUSeconds: float64(st.cpu_seconds), RoutesGPU: uint64(st.routes_gpu), CacheHits: uint64(st.cache_hits),
		CacheMisses: uint64(st.cache_misses), FetchedExperts: uint64(st.fetched_experts), FetchedBytes: uint64(st.fetched_bytes),
		PrefillCalls: uint64(st.prefill_calls), PrefillBytes: uint64(st.prefill_bytes), HybridFraction: float64(st.hybrid_fraction),
		HybridGPUSeconds: float64(st.hybrid_gpu_seconds), HybridTimedSteps: uint64(st.hybrid_timed_steps)}, err
}

// LayerStats returns MoE layer layer's slot cache figures (zero for the CPU backend).
func (s *Session) LayerStats(layer int) (LayerStats, error) {
	var st C.ft_layer_stats
	st.struct_size = C.uint32_t(unsafe.Sizeof(st))
	err := s.call(func(raw *C.ft_session) C.ft_status { return C.ft_session_get_layer_stats(raw, C.int32_t(layer), &st) })
	return LayerStats{Calls: uint64(st.calls), ActiveExperts: uint64(st.active_experts), Misses: uint64(st.misses),
		FetchedExperts: uint64(st.fetched_experts), FetchedBytes: uint64(st.fetched_bytes)}, err
}

// ResetStats zeroes the counters.
func (s *Session) ResetStats() {
	s.call(func(raw *C.ft_session) C.ft_status { C.ft_session_reset_stats(raw); return C.FT_OK })
}

// Status is nil, or the sticky failure of a session that cannot continue.
func (s *Session) Status() error {
	return s.call(func(raw *C.ft_session) C.ft_status { return C.ft_session_status(raw) })
}
