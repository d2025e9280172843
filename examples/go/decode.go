// A Go consumer of libfreetoken through cgo: builds a small MoE layer from memory, routes random
// router logits and decodes a batch, like examples/c/decode.c. Build against an installed
// library (only the standard library and cgo, so it builds offline):
//
//	PKG_CONFIG_PATH=PREFIX/lib/pkgconfig go build -o decode .
//
// and run it with the library on the loader path.
package main

// #cgo pkg-config: freetoken
// #include <freetoken.h>
// #include <stdlib.h>
import "C"

import (
	"fmt"
	"math"
	"os"
	"unsafe"
)

// Error is a failed call: its status and the library's error text.
type Error struct {
	Status  C.ft_status
	Message string
}

func (e *Error) Error() string {
	return C.GoString(C.ft_status_string(e.Status)) + ": " + e.Message
}

// check turns a status into an error, reading the handle's text only on failure (it is valid
// until the next call on that handle, so it is copied at once).
func check(status C.ft_status, text func() *C.char) error {
	if status == C.FT_OK {
		return nil
	}
	return &Error{Status: status, Message: C.GoString(text())}
}

// withErrBuf runs a creation call with a C buffer for its error text.
func withErrBuf(call func(err *C.char, size C.size_t) C.ft_status) error {
	const n = 256
	buf := (*C.char)(C.calloc(n, 1))
	defer C.free(unsafe.Pointer(buf))
	return check(call(buf, n), func() *C.char { return buf })
}

type Engine struct{ raw *C.ft_engine }

func NewEngine(params *C.ft_engine_params) (*Engine, error) {
	var raw *C.ft_engine
	if err := withErrBuf(func(e *C.char, n C.size_t) C.ft_status {
		return C.ft_engine_create(params, &raw, e, n)
	}); err != nil {
		return nil, err
	}
	return &Engine{raw}, nil
}

func (e *Engine) Close() { C.ft_engine_free(e.raw); e.raw = nil }

// Model must be closed before its engine.
type Model struct{ raw *C.ft_model }

func NewModel(engine *Engine, desc *C.ft_model_desc) (*Model, error) {
	var raw *C.ft_model
	if err := withErrBuf(func(e *C.char, n C.size_t) C.ft_status {
		return C.ft_model_create(engine.raw, desc, &raw, e, n)
	}); err != nil {
		return nil, err
	}
	return &Model{raw}, nil
}

func (m *Model) check(s C.ft_status) error {
	return check(s, func() *C.char { return C.ft_model_last_error(m.raw) })
}

func (m *Model) SetExpert(layer, expert, proj int, bf16 []uint16) error {
	return m.check(C.ft_model_set_expert(m.raw, C.int32_t(layer), C.int32_t(expert), C.int32_t(proj),
		unsafe.Pointer(&bf16[0]), C.size_t(len(bf16)*2)))
}

func (m *Model) Finalize() error { return m.check(C.ft_model_finalize(m.raw)) }

func (m *Model) Info() (C.ft_model_info, error) {
	var info C.ft_model_info
	info.struct_size = C.uint32_t(unsafe.Sizeof(info))
	return info, m.check(C.ft_model_get_info(m.raw, &info))
}

func (m *Model) Close() { C.ft_model_free(m.raw); m.raw = nil }

// Session is used by one goroutine at a time and must be closed before its model. Errors are
// per handle, not per thread, so goroutines moving between threads do not matter.
type Session struct{ raw *C.ft_session }

func NewSession(model *Model, params *C.ft_session_params) (*Session, error) {
	var raw *C.ft_session
	if err := withErrBuf(func(e *C.char, n C.size_t) C.ft_status {
		return C.ft_session_create(model.raw, params, &raw, e, n)
	}); err != nil {
		return nil, err
	}
	return &Session{raw}, nil
}

func (s *Session) check(st C.ft_status) error {
	return check(st, func() *C.char { return C.ft_session_last_error(s.raw) })
}

// Route: logits [T, E] -> ids, weights [T, K].
func (s *Session) Route(layer, tokens int, logits []float32, ids []int32, weights []float32) error {
	return s.check(C.ft_route(s.raw, C.int32_t(layer), C.int32_t(tokens), (*C.float)(&logits[0]),
		(*C.int32_t)(&ids[0]), (*C.float)(&weights[0])))
}

// Decode: hidden [T, H] bf16, ids/weights [T, K] -> out [T, H] bf16.
func (s *Session) Decode(layer, tokens int, hidden []uint16, ids []int32, weights []float32, out []uint16) error {
	return s.check(C.ft_decode(s.raw, C.int32_t(layer), C.int32_t(tokens), (*C.uint16_t)(&hidden[0]),
		(*C.int32_t)(&ids[0]), (*C.float)(&weights[0]), (*C.uint16_t)(&out[0])))
}

func (s *Session) Stats() (C.ft_session_stats, error) {
	var st C.ft_session_stats
	st.struct_size = C.uint32_t(unsafe.Sizeof(st))
	return st, s.check(C.ft_session_get_stats(s.raw, &st))
}

func (s *Session) Close() { C.ft_session_free(s.raw); s.raw = nil }

// xorshift32 in [-1, 1), the same stream as decode.c.
type rng uint32

func (r *rng) uniform() float32 {
	*r ^= *r << 13
	*r ^= *r >> 17
	*r ^= *r << 5
	return float32(uint32(*r)>>8)/8388608.0 - 1.0
}

func toBF16(f float32) uint16 {
	u := math.Float32bits(f)
	return uint16((u + 0x7fff + ((u >> 16) & 1)) >> 16)
}

func fromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "decode: "+format+"\n", args...)
	os.Exit(1)
}

func run() error {
	fmt.Println("libfreetoken", C.GoString(C.ft_version_string()))

	var ep C.ft_engine_params
	C.ft_engine_params_init(&ep)
	engine, err := NewEngine(&ep)
	if err != nil {
		return err
	}
	defer engine.Close()

	var desc C.ft_model_desc
	C.ft_model_desc_init(&desc)
	desc.num_layers, desc.num_experts, desc.top_k = 2, 16, 4
	desc.hidden_size, desc.intermediate_size = 256, 128
	model, err := NewModel(engine, &desc)
	if err != nil {
		return err
	}
	defer model.Close()
	r := rng(12345)
	w := make([]uint16, desc.hidden_size*desc.intermediate_size)
	for l := 0; l < int(desc.num_layers); l++ {
		for e := 0; e < int(desc.num_experts); e++ {
			for p := C.FT_PROJ_GATE; p <= C.FT_PROJ_DOWN; p++ {
				for i := range w {
					w[i] = toBF16(0.08 * r.uniform())
				}
				if err := model.SetExpert(l, e, p, w); err != nil {
					return err
				}
			}
		}
	}
	if err := model.Finalize(); err != nil {
		return err
	}
	info, err := model.Info()
	if err != nil {
		return err
	}

	var sp C.ft_session_params
	C.ft_session_params_init(&sp)
	sp.backend, sp.max_tokens = C.FT_BACKEND_CPU, 8
	session, err := NewSession(model, &sp)
	if err != nil {
		return err
	}
	defer session.Close()

	T, E, K, H := 4, int(info.num_experts), int(info.top_k), int(info.hidden_size)
	logits := make([]float32, T*E)
	for i := range logits {
		logits[i] = 2 * r.uniform()
	}
	x := make([]uint16, T*H)
	for i := range x {
		x[i] = toBF16(r.uniform())
	}
	ids, weights, y := make([]int32, T*K), make([]float32, T*K), make([]uint16, T*H)
	for layer := 0; layer < int(info.num_layers); layer++ {
		if err := session.Route(layer, T, logits, ids, weights); err != nil {
			return err
		}
		if err := session.Decode(layer, T, x, ids, weights, y); err != nil {
			return err
		}
		norm := 0.0
		for _, v := range y {
			f := float64(fromBF16(v))
			if math.IsNaN(f) || math.IsInf(f, 0) {
				fail("non-finite output")
			}
			norm += f * f
		}
		fmt.Printf("layer %d: token 0 -> experts", layer)
		for k := 0; k < K; k++ {
			fmt.Printf(" %d(%.3f)", ids[k], weights[k])
		}
		fmt.Printf(", |out| = %.4f\n", math.Sqrt(norm))
		if norm == 0 {
			fail("output is all zeros")
		}
	}

	st, err := session.Stats()
	if err != nil {
		return err
	}
	fmt.Printf("%d routes, %d distinct expert reads, %.1f MB read\n", st.routes_cpu, st.experts_cpu,
		float64(st.cpu_bytes)/1e6)
	layers := uint64(info.num_layers)
	if uint64(st.decode_calls) != layers || uint64(st.routes_cpu) != layers*uint64(T*K) {
		fail("unexpected stats %+v", st)
	}

	// Bad input comes back as a status with text, not a crash.
	bad := make([]int32, T*K)
	for i := range bad {
		bad[i] = int32(E)
	}
	err = session.Decode(0, T, x, bad, weights, y)
	if fe, ok := err.(*Error); !ok || fe.Status != C.FT_ERR_INVALID_ARGUMENT || fe.Message == "" {
		fail("bad id gave %v, not FT_ERR_INVALID_ARGUMENT with text", err)
	}
	fmt.Println("error text:", err)
	return nil
}

func main() {
	if err := run(); err != nil {
		fail("%v", err)
	}
}
