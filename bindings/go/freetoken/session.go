package freetoken

/*
#include <freetoken.h>

// Declared here rather than through freetoken_cuda.h, which needs CUDA's headers; cudaStream_t
// is a pointer, passed as void *.
ft_status ft_decode_cuda(ft_session *session, int32_t layer, int32_t num_tokens, const uint16_t *hidden,
                         const int32_t *expert_ids, const float *expert_weights, uint16_t *out, void *stream);

static ft_status ft_decode_cuda_u(ft_session *s, int32_t layer, int32_t n, uintptr_t hidden, uintptr_t ids,
                                  uintptr_t weights, uintptr_t out, uintptr_t stream) {
    return ft_decode_cuda(s, layer, n, (const uint16_t *)hidden, (const int32_t *)ids, (const float *)weights,
                          (uint16_t *)out, (void *)stream);
}
*/
import "C"

import (
	"runtime"
	"sync/atomic"
	"unsafe"
)

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
	CachePolicy           int // CacheLRU, CacheFrequency or CacheAuto (the default: the backend's faster one)
	CacheHalfLife         int // CacheFrequency: decode steps after which an access counts half (0 = 8)
}

// DefaultSessionParams returns the library's defaults.
func DefaultSessionParams() SessionParams {
	var p C.ft_session_params
	C.ft_session_params_init(&p)
	return SessionParams{Backend: int(p.backend), MaxTokens: int(p.max_tokens), SharedExperts: bool(p.shared_experts),
		CheckFinite: bool(p.check_finite), CacheSlots: int64(p.cache_slots), CacheFraction: float64(p.cache_fraction),
		VramReserveBytes: uint64(p.vram_reserve_bytes), PrefillMinTokens: int(p.prefill_min_tokens),
		HybridFraction: float32(p.hybrid_fraction), HybridAdaptive: bool(p.hybrid_adaptive),
		HandoffTimeoutSeconds: float64(p.handoff_timeout_seconds), CachePolicy: int(p.cache_policy),
		CacheHalfLife: int(p.cache_half_life)}
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
		policy, err := toInt32(params.CachePolicy, "CachePolicy")
		if err != nil {
			return nil, err
		}
		halfLife, err := toInt32(params.CacheHalfLife, "CacheHalfLife")
		if err != nil {
			return nil, err
		}
		p.cache_policy, p.cache_half_life = policy, halfLife
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

// CachePolicy is the slot cache policy the session runs (CacheAuto resolved), or -1 for a backend
// without a slot cache (cpu, gpu).
func (s *Session) CachePolicy() int {
	c := -1
	s.call(func(raw *C.ft_session) C.ft_status { c = int(C.ft_session_cache_policy(raw)); return C.FT_OK })
	return c
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

// RouteTokens is Route for models whose first HashLayers MoE layers choose their experts by token
// id (DeepSeek-V4): tokens [T] holds the tokens' ids (may be nil on the other layers).
func (s *Session) RouteTokens(layer int, logits []float32, tokens []int32, ids []int32, weights []float32) error {
	t, err := rowsOf(len(logits), s.e, "logits")
	if err != nil {
		return err
	}
	if tokens != nil {
		if err := expectLen(len(tokens), t, "tokens"); err != nil {
			return err
		}
	}
	if err := expectLen(len(ids), t*s.k, "ids"); err != nil {
		return err
	}
	if err := expectLen(len(weights), t*s.k, "weights"); err != nil {
		return err
	}
	n, err := toInt32(t, "tokens")
	if err != nil {
		return err
	}
	var tp *C.int32_t
	if len(tokens) > 0 {
		tp = (*C.int32_t)(&tokens[0])
	}
	return s.call(func(raw *C.ft_session) C.ft_status {
		return C.ft_route_tokens(raw, C.int32_t(layer), n, (*C.float)(&logits[0]), tp, (*C.int32_t)(&ids[0]), (*C.float)(&weights[0]))
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
