package freetoken

/*
#include <freetoken.h>
#include <stdlib.h>

extern bool ftGoProgress(void *user_data, char *phase, uint64_t done, uint64_t total);

static void ft_set_load_progress(ft_model_load_params *p, uintptr_t h) {
    p->progress = (ft_progress_fn)ftGoProgress;
    p->progress_user_data = (void *)h;
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"
)

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
	// FormatsUsed has bit 1<<FT_FORMAT_x per format of some layer's gate/up or down matrices;
	// MixedFormats: they differ (LayerFormats), and Format is MoE layer 0's gate/up format.
	FormatsUsed  uint32
	MixedFormats bool
	// HashLayers: MoE layers 0..HashLayers-1 route by token id (Session.RouteTokens), with token
	// ids in [0, VocabSize).
	HashLayers, VocabSize int
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
		BankBytes: uint64(i.bank_bytes), PinnedBytes: uint64(i.pinned_bytes), Architecture: C.GoString(i.architecture),
		FormatsUsed: uint32(i.formats_used), MixedFormats: i.mixed_formats != 0,
		HashLayers: int(i.hash_layers), VocabSize: int(i.vocab_size)}
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

// LayerFormats returns the gate/up and down formats (FT_FORMAT_*) of MoE layer layer.
func (m *Model) LayerFormats(layer int) (gateUp, down int, err error) {
	err = m.h.shared(func(raw *C.ft_model) error {
		var gu, dn C.int32_t
		s := C.ft_model_layer_formats(raw, C.int32_t(layer), &gu, &dn)
		gateUp, down = int(gu), int(dn)
		return check(s, func() string { return fmt.Sprintf("ft_model_layer_formats: no MoE layer %d", layer) })
	})
	return
}

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
