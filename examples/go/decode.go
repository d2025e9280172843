// A Go program using libfreetoken through the freetoken package: builds a small MoE layer from
// memory, routes random router logits and decodes a batch, like examples/c/decode.c. Build
// against an installed library (Go 1.19 or newer, no module downloads), with a run path to the
// library's folder so the program runs without LD_LIBRARY_PATH:
//
//	export PKG_CONFIG_PATH=PREFIX/lib/pkgconfig
//	CGO_LDFLAGS="-Wl,-rpath,$(pkg-config --variable=libdir freetoken)" go build -o decode .
package main

import (
	"errors"
	"fmt"
	"math"
	"os"

	"freetoken"
)

// xorshift32 in [-1, 1), the same stream as decode.c.
type rng uint32

func (r *rng) uniform() float32 {
	*r ^= *r << 13
	*r ^= *r >> 17
	*r ^= *r << 5
	return float32(uint32(*r)>>8)/8388608.0 - 1.0
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "decode: "+format+"\n", args...)
	os.Exit(1)
}

func run() error {
	version, _ := freetoken.Version()
	fmt.Println("libfreetoken", version)
	engine, err := freetoken.NewEngine(nil)
	if err != nil {
		return err
	}
	defer engine.Close()

	desc := freetoken.DefaultModelDesc()
	desc.NumLayers, desc.NumExperts, desc.TopK, desc.HiddenSize, desc.IntermediateSize = 2, 16, 4, 256, 128
	model, err := freetoken.NewModel(engine, desc)
	if err != nil {
		return err
	}
	defer model.Close()
	r := rng(12345)
	w := make([]freetoken.BF16, desc.HiddenSize*desc.IntermediateSize)
	for l := 0; l < desc.NumLayers; l++ {
		for e := 0; e < desc.NumExperts; e++ {
			for _, p := range []int{freetoken.ProjGate, freetoken.ProjUp, freetoken.ProjDown} {
				for i := range w {
					w[i] = freetoken.BF16FromFloat32(0.08 * r.uniform())
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
	info := model.Info()

	sp := freetoken.DefaultSessionParams()
	sp.Backend, sp.MaxTokens = freetoken.BackendCPU, 8
	session, err := freetoken.NewSession(model, &sp)
	if err != nil {
		return err
	}
	defer session.Close()

	T, E, K, H := 4, info.NumExperts, info.TopK, info.HiddenSize
	logits := make([]float32, T*E)
	for i := range logits {
		logits[i] = 2 * r.uniform()
	}
	x := make([]freetoken.BF16, T*H)
	for i := range x {
		x[i] = freetoken.BF16FromFloat32(r.uniform())
	}
	ids, weights, y := make([]int32, T*K), make([]float32, T*K), make([]freetoken.BF16, T*H)
	for layer := 0; layer < info.NumLayers; layer++ {
		if err := session.Route(layer, logits, ids, weights); err != nil {
			return err
		}
		if err := session.Decode(layer, x, ids, weights, y); err != nil {
			return err
		}
		norm := 0.0
		for _, v := range y {
			f := float64(v.Float32())
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
	fmt.Printf("%d routes, %d distinct expert reads, %.1f MB read\n", st.RoutesCPU, st.ExpertsCPU, float64(st.CPUBytes)/1e6)
	layers := uint64(info.NumLayers)
	if st.DecodeCalls != layers || st.RoutesCPU != layers*uint64(T*K) {
		fail("unexpected stats %+v", st)
	}

	// Bad input comes back as an error carrying the status, not a crash; and a slice of the
	// wrong length is refused before the library sees it.
	bad := make([]int32, T*K)
	for i := range bad {
		bad[i] = int32(E)
	}
	err = session.Decode(0, x, bad, weights, y)
	var fe *freetoken.Error
	if !errors.As(err, &fe) || fe.Status != freetoken.StatusInvalidArgument || fe.Message == "" {
		fail("bad id gave %v, not FT_ERR_INVALID_ARGUMENT with text", err)
	}
	fmt.Println("error text:", err)
	if err := session.Decode(0, x, ids[:K], weights, y); !errors.Is(err, freetoken.StatusInvalidArgument) {
		fail("a short ids slice gave %v", err)
	}
	return nil
}

func main() {
	if err := run(); err != nil {
		fail("%v", err)
	}
}
