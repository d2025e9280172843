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
*/
import "C"

import (
	"math"
)

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
	FormatQ8_0     = int(C.FT_FORMAT_Q8_0)
	FormatQ2_K     = int(C.FT_FORMAT_Q2_K)
	FormatQ3_K     = int(C.FT_FORMAT_Q3_K)
	FormatQ4_K     = int(C.FT_FORMAT_Q4_K)
	FormatQ5_K     = int(C.FT_FORMAT_Q5_K)
	FormatQ6_K     = int(C.FT_FORMAT_Q6_K)
	FormatIQ4_XS   = int(C.FT_FORMAT_IQ4_XS)

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
	CacheLRU                     = int(C.FT_CACHE_LRU)
	CacheFrequency               = int(C.FT_CACHE_FREQUENCY)
	CacheAuto                    = int(C.FT_CACHE_AUTO)
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
