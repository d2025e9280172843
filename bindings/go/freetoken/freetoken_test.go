package freetoken

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
)

const (
	tL, tE, tK, tH, tI = 2, 8, 2, 64, 32
)

type rng uint32

func (r *rng) uniform() float32 {
	*r ^= *r << 13
	*r ^= *r >> 17
	*r ^= *r << 5
	return float32(uint32(*r)>>8)/8388608.0 - 1.0
}

// weights [layer][expert][proj] of a small model.
func testWeights() [][][3][]BF16 {
	r := rng(7)
	gen := func(n int) []BF16 {
		v := make([]BF16, n)
		for i := range v {
			v[i] = BF16FromFloat32(0.1 * r.uniform())
		}
		return v
	}
	w := make([][][3][]BF16, tL)
	for l := range w {
		w[l] = make([][3][]BF16, tE)
		for e := range w[l] {
			w[l][e] = [3][]BF16{gen(tI * tH), gen(tI * tH), gen(tH * tI)}
		}
	}
	return w
}

func testEngine(t *testing.T) *Engine {
	p := DefaultEngineParams()
	p.Device, p.CPUThreads, p.PinThreads = DeviceNone, 2, false
	e, err := NewEngine(&p)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func testModel(t *testing.T, e *Engine, w [][][3][]BF16) *Model {
	d := DefaultModelDesc()
	d.NumLayers, d.NumExperts, d.TopK, d.HiddenSize, d.IntermediateSize = tL, tE, tK, tH, tI
	m, err := NewModel(e, d)
	if err != nil {
		t.Fatal(err)
	}
	for l := range w {
		for x := range w[l] {
			for p, proj := range []int{ProjGate, ProjUp, ProjDown} {
				if err := m.SetExpert(l, x, proj, w[l][x][p]); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if err := m.Finalize(); err != nil {
		t.Fatal(err)
	}
	return m
}

func cpuSession(t *testing.T, m *Model) *Session {
	p := DefaultSessionParams()
	p.Backend, p.MaxTokens = BackendCPU, 8
	s, err := NewSession(m, &p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// reference: out[t] = sum_k w[t,k] * down(silu(gate x) * up x) in float64 from the bf16 inputs.
func reference(w [][3][]BF16, x []BF16, ids []int32, wts []float32) []float64 {
	T := len(x) / tH
	out := make([]float64, T*tH)
	for tok := 0; tok < T; tok++ {
		for k := 0; k < tK; k++ {
			ex := w[ids[tok*tK+k]]
			act := make([]float64, tI)
			for i := 0; i < tI; i++ {
				var g, u float64
				for h := 0; h < tH; h++ {
					xv := float64(x[tok*tH+h].Float32())
					g += float64(ex[0][i*tH+h].Float32()) * xv
					u += float64(ex[1][i*tH+h].Float32()) * xv
				}
				act[i] = g / (1 + math.Exp(-g)) * u
			}
			for h := 0; h < tH; h++ {
				var d float64
				for i := 0; i < tI; i++ {
					d += float64(ex[2][h*tI+i].Float32()) * act[i]
				}
				out[tok*tH+h] += float64(wts[tok*tK+k]) * d
			}
		}
	}
	return out
}

// checkNearReference fails t unless every element of y is within 2% of want's largest magnitude.
func checkNearReference(t *testing.T, y []BF16, want []float64) {
	t.Helper()
	scale := 0.0
	for _, v := range want {
		scale = math.Max(scale, math.Abs(v))
	}
	for i := range y {
		if math.Abs(float64(y[i].Float32())-want[i]) > 0.02*scale {
			t.Fatalf("out[%d] = %v, reference %v", i, y[i].Float32(), want[i])
		}
	}
}

func TestBF16(t *testing.T) {
	cases := []struct {
		f    float32
		bits BF16
	}{{1, 0x3f80}, {-2, 0xc000}, {1 + 1.0/256, 0x3f80}, {1 + 3.0/256, 0x3f82}}
	for _, c := range cases {
		if got := BF16FromFloat32(c.f); got != c.bits {
			t.Errorf("BF16FromFloat32(%v) = %#x, want %#x", c.f, got, c.bits)
		}
	}
	if nan := BF16FromFloat32(float32(math.NaN())).Float32(); nan == nan {
		t.Error("NaN did not stay NaN")
	}
}

func TestVersionAndStatus(t *testing.T) {
	s, n := Version()
	if s != fmt.Sprintf("%d.%d.%d", n/10000, n/100%100, n%100) {
		t.Errorf("version %q vs %d", s, n)
	}
	if StatusFormat.String() != "FT_ERR_FORMAT" || Status(999).String() != "FT_ERR_UNKNOWN" {
		t.Error("status names")
	}
	var err error = &Error{Status: StatusIO, Message: "gone"}
	if !errors.Is(err, StatusIO) || errors.Is(err, StatusFormat) || err.Error() != "FT_ERR_IO: gone" {
		t.Errorf("errors.Is / Error(): %v", err)
	}
}

func TestDefaults(t *testing.T) {
	if p := DefaultEngineParams(); p.Device != DeviceAuto || p.CPUThreads != 0 || !p.PinThreads {
		t.Errorf("engine defaults %+v", p)
	}
	if d := DefaultModelDesc(); d.Format != FormatBF16 || d.Routing != RoutingSoftmaxTopKRenorm {
		t.Errorf("model defaults %+v", d)
	}
	if p := DefaultSessionParams(); p.Backend != BackendAuto || p.MaxTokens != 256 || !p.CheckFinite || p.CachePolicy != CacheAuto {
		t.Errorf("session defaults %+v", p)
	}
	if p := DefaultEPParams(); p.TopK != 8 || p.Wire != EPWireFP8 || p.CombineWire != EPWireBF16 {
		t.Errorf("EP defaults %+v", p)
	}
}

func TestRouteAndDecodeMatchReference(t *testing.T) {
	e := testEngine(t)
	defer e.Close()
	if info, err := e.Info(); err != nil || info.Device != DeviceNone || info.CPUThreads != 2 {
		t.Fatalf("engine info %+v, %v", info, err)
	}
	w := testWeights()
	m := testModel(t, e, w)
	defer m.Close()
	s := cpuSession(t, m)
	defer s.Close()
	if s.Backend() != BackendCPU || s.BackendReason() == "" {
		t.Errorf("backend %d (%q)", s.Backend(), s.BackendReason())
	}
	if c := s.CachePolicy(); c != -1 { // the cpu backend has no slot cache
		t.Errorf("cache policy %d", c)
	}
	const T = 3
	r := rng(99)
	logits := make([]float32, T*tE)
	for i := range logits {
		logits[i] = 3 * r.uniform()
	}
	x := make([]BF16, T*tH)
	for i := range x {
		x[i] = BF16FromFloat32(r.uniform())
	}
	ids, wts, y := make([]int32, T*tK), make([]float32, T*tK), make([]BF16, T*tH)
	for layer := 0; layer < tL; layer++ {
		if err := s.Route(layer, logits, ids, wts); err != nil {
			t.Fatal(err)
		}
		for tok := 0; tok < T; tok++ {
			row := logits[tok*tE : (tok+1)*tE]
			best := 0
			for i := range row {
				if row[i] > row[best] {
					best = i
				}
			}
			if ids[tok*tK] != int32(best) || math.Abs(float64(wts[tok*tK]+wts[tok*tK+1])-1) > 1e-5 {
				t.Errorf("token %d: ids %v weights %v, best %d", tok, ids[tok*tK:tok*tK+tK], wts[tok*tK:tok*tK+tK], best)
			}
		}
		if err := s.Decode(layer, x, ids, wts, y); err != nil {
			t.Fatal(err)
		}
		checkNearReference(t, y, reference(w[layer], x, ids, wts))
	}
	st, err := s.Stats()
	if err != nil || st.DecodeCalls != tL || st.Tokens != tL*T || st.RoutesCPU != tL*T*tK {
		t.Errorf("stats %+v, %v", st, err)
	}
	s.ResetStats()
	if st, _ := s.Stats(); st.DecodeCalls != 0 {
		t.Error("ResetStats")
	}
	if err := s.Status(); err != nil {
		t.Error(err)
	}
}

func TestLengthsAndErrors(t *testing.T) {
	e := testEngine(t)
	defer e.Close()
	m := testModel(t, e, testWeights())
	defer m.Close()
	s := cpuSession(t, m)
	defer s.Close()
	bad := func(err error, what string) {
		t.Helper()
		var fe *Error
		if !errors.As(err, &fe) || fe.Status != StatusInvalidArgument || !strings.Contains(fe.Message, what) {
			t.Errorf("got %v, want FT_ERR_INVALID_ARGUMENT naming %q", err, what)
		}
	}
	logits := make([]float32, 2*tE)
	bad(s.Route(0, logits, make([]int32, 2*tK-1), make([]float32, 2*tK)), "ids")
	bad(s.Route(0, logits[1:], make([]int32, 2*tK), make([]float32, 2*tK)), "logits")
	bad(s.Route(0, nil, nil, nil), "logits")
	x, y := make([]BF16, 2*tH), make([]BF16, 2*tH)
	bad(s.Decode(0, x, make([]int32, 2*tK), make([]float32, 2*tK), y[1:]), "out")
	bad(s.Decode(0, x, make([]int32, tK), make([]float32, 2*tK), y), "ids")
	ids := []int32{tE, 0, 0, 0}
	err := s.Decode(0, x, ids, make([]float32, 2*tK), y)
	if !errors.Is(err, StatusInvalidArgument) || strings.Contains(err.Error(), "elements") {
		t.Errorf("bad id: %v", err)
	}
	nan := make([]BF16, 2*tH)
	for i := range nan {
		nan[i] = BF16FromFloat32(float32(math.NaN()))
	}
	if err := s.Decode(0, nan, make([]int32, 2*tK), make([]float32, 2*tK), y); !errors.Is(err, StatusNonFinite) {
		t.Errorf("NaN input: %v", err)
	}

	d := DefaultModelDesc()
	d.NumLayers, d.NumExperts, d.TopK, d.HiddenSize, d.IntermediateSize = 1, tE, tK, tH, tI
	b, err := NewModel(e, d)
	if err != nil {
		t.Fatal(err)
	}
	bad(b.SetExpert(0, 0, ProjGate, make([]BF16, tH*tI+1)), "projection")
	bad(b.SetRouterBias(0, make([]float32, tE-1)), "bias")
	if err := b.Finalize(); !errors.Is(err, StatusState) {
		t.Errorf("finalize with missing experts: %v", err)
	}
	b.Close()
	if _, err := NewModel(e, DefaultModelDesc()); !errors.Is(err, StatusInvalidArgument) {
		t.Errorf("empty desc: %v", err)
	}
	if _, err := LoadModel(e, "/nonexistent/freetoken-checkpoint", nil); !errors.Is(err, StatusIO) ||
		!strings.Contains(err.Error(), "/nonexistent/freetoken-checkpoint") {
		t.Errorf("missing checkpoint: %v", err)
	}
	if _, err := m.Tensor(0, TensorRouterWeight); !errors.Is(err, StatusUnsupported) {
		t.Errorf("tensor of a built model: %v", err)
	}
}

func TestCloseOrder(t *testing.T) {
	e := testEngine(t)
	m := testModel(t, e, testWeights())
	s := cpuSession(t, m)
	if err := e.Close(); !errors.Is(err, StatusState) {
		t.Errorf("engine close with an open model: %v", err)
	}
	if err := m.Close(); !errors.Is(err, StatusState) {
		t.Errorf("model close with an open session: %v", err)
	}
	s.Close()
	s.Close() // idempotent
	if err := s.Decode(0, make([]BF16, tH), make([]int32, tK), make([]float32, tK), make([]BF16, tH)); !errors.Is(err, StatusState) {
		t.Errorf("decode on a closed session: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Error(err)
	}
	if err := e.Close(); err != nil {
		t.Error(err)
	}
}

func TestSharedModelManyGoroutines(t *testing.T) {
	e := testEngine(t)
	defer e.Close()
	m := testModel(t, e, testWeights())
	defer m.Close()
	x := make([]BF16, tH)
	for i := range x {
		x[i] = BF16FromFloat32(float32(math.Sin(float64(i) * 0.37)))
	}
	outs := make([][]BF16, 4)
	var wg sync.WaitGroup
	for g := range outs {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			s := cpuSession(t, m)
			defer s.Close()
			y := make([]BF16, tH)
			for i := 0; i < 5; i++ {
				if err := s.Decode(1, x, []int32{3, 5}, []float32{0.25, 0.75}, y); err != nil {
					t.Error(err)
				}
			}
			outs[g] = y
		}(g)
	}
	wg.Wait()
	for g := range outs {
		for i := range outs[g] {
			if outs[g][i] != outs[0][i] {
				t.Fatalf("goroutine %d differs at %d", g, i)
			}
		}
	}
}

func TestLogCallback(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	SetLogCallback(LogDebug, func(level int, msg string) {
		mu.Lock()
		lines = append(lines, fmt.Sprintf("%d %s", level, msg))
		mu.Unlock()
	})
	e := testEngine(t)
	defer e.Close()
	m := testModel(t, e, testWeights())
	defer m.Close()
	s := cpuSession(t, m)
	defer s.Close()
	s.Decode(0, make([]BF16, tH), []int32{tE + 40, 0}, []float32{0.5, 0.5}, make([]BF16, tH))
	ResetLogCallback(LogWarn)
	mu.Lock()
	defer mu.Unlock()
	found := false
	for _, l := range lines {
		found = found || (strings.HasPrefix(l, fmt.Sprint(LogDebug)) && strings.Contains(l, "FT_ERR_INVALID_ARGUMENT"))
	}
	if !found {
		t.Errorf("no debug line naming the error among %q", lines)
	}
}

func TestProfileProgress(t *testing.T) {
	var calls []string
	opts := DefaultProfileOptions()
	opts.Device, opts.Formats = DeviceNone, []int{FormatBF16}
	opts.Progress = func(phase string, done, total uint64) bool {
		calls = append(calls, phase)
		return false
	}
	if _, err := MeasureProfile(&opts); !errors.Is(err, StatusCancelled) || len(calls) != 1 || calls[0] != "read" {
		t.Errorf("cancel: %v after %q", err, calls)
	}
	opts.Progress = func(string, uint64, uint64) bool { panic("from the progress func") }
	func() {
		defer func() {
			if r := recover(); r != "from the progress func" {
				t.Errorf("recovered %v", r)
			}
		}()
		MeasureProfile(&opts)
	}()
	if _, err := LoadProfile("/nonexistent/freetoken-profile.json"); !errors.Is(err, StatusIO) {
		t.Errorf("missing profile: %v", err)
	}
}

func TestEPWithoutNCCL(t *testing.T) {
	p := DefaultEPParams()
	p.NumExperts, p.Hidden, p.MaxTokens = 8, 128, 16
	groups, err := EPBootstrapLocal([]int{0}, &p)
	if err == nil {
		for _, g := range groups {
			g.Close()
		}
		t.Skip("this library has CUDA and NCCL")
	}
	if !errors.Is(err, StatusUnsupported) && !errors.Is(err, StatusNoDevice) {
		t.Errorf("EP on a build without NCCL: %v", err)
	}
}
