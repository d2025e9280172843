package freetoken

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writeCheckpoint writes a small Mixtral-layout bf16 checkpoint (config.json and
// model.safetensors) into dir: router element i of layer l is bf16(0.01*(i%7) - 0.03 + l), the
// experts hold w.
func writeCheckpoint(t *testing.T, dir string, w [][][3][]BF16) {
	config := fmt.Sprintf(`{"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": %d,
		"num_hidden_layers": %d, "num_experts_per_tok": %d, "num_local_experts": %d, "intermediate_size": %d,
		"hidden_act": "silu", "torch_dtype": "bfloat16"}`, tH, tL, tK, tE, tI)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	type entry struct {
		Dtype   string `json:"dtype"`
		Shape   []int  `json:"shape"`
		Offsets [2]int `json:"data_offsets"`
	}
	header := map[string]entry{}
	var data []byte
	add := func(name string, shape []int, v []BF16) {
		header[name] = entry{"BF16", shape, [2]int{len(data), len(data) + 2*len(v)}}
		for _, b := range v {
			data = binary.LittleEndian.AppendUint16(data, uint16(b))
		}
	}
	for l := range w {
		p := fmt.Sprintf("model.layers.%d.block_sparse_moe.", l)
		router := make([]BF16, tE*tH)
		for i := range router {
			router[i] = BF16FromFloat32(0.01*float32(i%7) - 0.03 + float32(l))
		}
		add(p+"gate.weight", []int{tE, tH}, router)
		for e := range w[l] {
			add(fmt.Sprintf("%sexperts.%d.w1.weight", p, e), []int{tI, tH}, w[l][e][0])
			add(fmt.Sprintf("%sexperts.%d.w3.weight", p, e), []int{tI, tH}, w[l][e][1])
			add(fmt.Sprintf("%sexperts.%d.w2.weight", p, e), []int{tH, tI}, w[l][e][2])
		}
	}
	h, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	file := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	file = append(append(file, h...), data...)
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), file, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadCheckpointWithProgress(t *testing.T) {
	e := testEngine(t)
	defer e.Close()
	w := testWeights()
	dir := t.TempDir()
	writeCheckpoint(t, dir, w)
	var done, total []uint64
	m, err := LoadModel(e, dir, &LoadOptions{IOThreads: 1, Progress: func(phase string, d, tot uint64) bool {
		done, total = append(done, d), append(total, tot)
		return true
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if n := len(done); n == 0 || total[n-1] == 0 || done[n-1] != total[n-1] {
		t.Errorf("progress reports done %v of %v", done, total)
	}
	info := m.Info()
	if info.Architecture != "mixtral" || info.NumLayers != tL || info.NumExperts != tE || info.TopK != tK {
		t.Errorf("info %+v", info)
	}
	if m.MoeLayer(1) != 1 || m.MoeLayer(tL) != -1 {
		t.Errorf("MoeLayer: %d %d", m.MoeLayer(1), m.MoeLayer(tL))
	}
	r, err := m.Tensor(1, TensorRouterWeight)
	if err != nil || r.Dtype != DtypeBF16 || len(r.Shape) != 2 || r.Shape[0] != tE || r.Shape[1] != tH || len(r.Data) != 2*tE*tH {
		t.Fatalf("router tensor %v %v (%d bytes), %v", r.Dtype, r.Shape, len(r.Data), err)
	}
	if got := BF16(binary.LittleEndian.Uint16(r.Data[20:])); got != BF16FromFloat32(0.01*3-0.03+1) {
		t.Errorf("router element 10 = %v", got.Float32())
	}
	s := cpuSession(t, m)
	defer s.Close()
	x := make([]BF16, tH)
	for i := range x {
		x[i] = BF16FromFloat32(float32(i%5) * 0.2)
	}
	y := make([]BF16, tH)
	ids, wts := []int32{1, 3}, []float32{0.6, 0.4}
	if err := s.Decode(0, x, ids, wts, y); err != nil {
		t.Fatal(err)
	}
	checkNearReference(t, y, reference(w[0], x, ids, wts))

	_, err = LoadModel(e, dir, &LoadOptions{Progress: func(string, uint64, uint64) bool { return false }})
	if !errors.Is(err, StatusCancelled) {
		t.Errorf("cancelled load: %v", err)
	}
}

// Close on an engine while a load runs on it waits for the load, then refuses: the loaded model
// is open. (Freeing the engine under the load would leave the library using freed memory.)
func TestEngineCloseDuringLoad(t *testing.T) {
	e := testEngine(t)
	dir := t.TempDir()
	writeCheckpoint(t, dir, testWeights())
	started, release := make(chan struct{}), make(chan struct{})
	closed := make(chan error, 1)
	go func() {
		<-started
		go func() { closed <- e.Close() }()
		time.Sleep(200 * time.Millisecond) // Close runs while the load is held in its callback
		close(release)
	}()
	first := true
	m, err := LoadModel(e, dir, &LoadOptions{IOThreads: 1, Progress: func(string, uint64, uint64) bool {
		if first {
			first = false
			close(started)
			<-release
		}
		return true
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-closed; !errors.Is(err, StatusState) {
		t.Errorf("engine Close during a load: %v, want StatusState (the model is open)", err)
	}
	if err := m.Close(); err != nil {
		t.Error(err)
	}
	if err := e.Close(); err != nil {
		t.Error(err)
	}
}
