package freetoken

/*
#include <freetoken_ep.h>
#include <stdlib.h>
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// EP modes and wire formats (freetoken_ep.h).
const (
	EPModeThroughput = int(C.FT_EP_MODE_THROUGHPUT)
	EPModeLatency    = int(C.FT_EP_MODE_LATENCY)
	EPWireBF16       = int(C.FT_EP_WIRE_BF16)
	EPWireFP8        = int(C.FT_EP_WIRE_FP8)
	EPWireFP8UE8M0   = int(C.FT_EP_WIRE_FP8_UE8M0)
)

// EPParams are expert-parallel group settings; DefaultEPParams gives the library's defaults
// (NumExperts, Hidden and MaxTokens must be set).
type EPParams struct {
	NumExperts, SlotsPerRank, TopK  int
	Hidden, MaxTokens               int64
	Mode, Wire, Chunks, NCCLMaxCTAs int
	LinkBytesPerS                   float64
	MaxExpertRows                   int64
	CombineWire                     int
	CombineMaxRelError              float32
}

// DefaultEPParams returns the library's defaults.
func DefaultEPParams() EPParams {
	var p C.ft_ep_params
	C.ft_ep_params_init(&p)
	return EPParams{NumExperts: int(p.num_experts), SlotsPerRank: int(p.slots_per_rank), TopK: int(p.top_k),
		Hidden: int64(p.hidden), MaxTokens: int64(p.max_tokens), Mode: int(p.mode), Wire: int(p.wire),
		Chunks: int(p.chunks), NCCLMaxCTAs: int(p.nccl_max_ctas), LinkBytesPerS: float64(p.link_bytes_per_s),
		MaxExpertRows: int64(p.max_expert_rows), CombineWire: int(p.combine_wire),
		CombineMaxRelError: float32(p.combine_max_rel_error)}
}

func (e *EPParams) raw() C.ft_ep_params {
	var p C.ft_ep_params
	C.ft_ep_params_init(&p)
	p.num_experts, p.slots_per_rank, p.top_k = C.int32_t(e.NumExperts), C.int32_t(e.SlotsPerRank), C.int32_t(e.TopK)
	p.hidden, p.max_tokens, p.mode, p.wire = C.int64_t(e.Hidden), C.int64_t(e.MaxTokens), C.int32_t(e.Mode), C.int32_t(e.Wire)
	p.chunks, p.nccl_max_ctas, p.link_bytes_per_s = C.int32_t(e.Chunks), C.int32_t(e.NCCLMaxCTAs), C.double(e.LinkBytesPerS)
	p.max_expert_rows, p.combine_wire = C.int64_t(e.MaxExpertRows), C.int32_t(e.CombineWire)
	p.combine_max_rel_error = C.float(e.CombineMaxRelError)
	return p
}

// EPGroupInfo is a group's rank and topology.
type EPGroupInfo struct {
	Rank, Ranks, SlotsPerRank, Device, NCCLVersion int
	PCIBusID                                       string
	NUMANode                                       int
	LinkBytesPerS                                  float64
}

// EPGroup is one rank (one GPU) of an expert-parallel group (NCCL). Used by one goroutine at a
// time. Needs a CUDA build and NCCL at run time, else creation fails with StatusUnsupported.
// The per-layer calls (dispatch, combine, forward) take device memory and are left to the C API.
type EPGroup struct {
	h owned[C.ft_ep_group]
}

func newEPGroup(raw *C.ft_ep_group) *EPGroup {
	g := &EPGroup{h: owned[C.ft_ep_group]{raw: raw, what: "the group"}}
	runtime.SetFinalizer(g, func(g *EPGroup) { g.Close() })
	return g
}

// EPBootstrapLocal makes one group per listed device of this process; element i is rank i.
func EPBootstrapLocal(devices []int, params *EPParams) ([]*EPGroup, error) {
	if len(devices) == 0 {
		return nil, invalid("no devices")
	}
	p := params.raw()
	devs := make([]C.int32_t, len(devices))
	for i, d := range devices {
		devs[i] = C.int32_t(d)
	}
	n := C.size_t(len(devices)) * C.size_t(unsafe.Sizeof((*C.ft_ep_group)(nil)))
	groups := (**C.ft_ep_group)(C.calloc(n, 1))
	defer C.free(unsafe.Pointer(groups))
	if err := withErrBuf(func(e *C.char, sz C.size_t) C.ft_status {
		return C.ft_ep_group_bootstrap_local(C.int32_t(len(devices)), &devs[0], &p, groups, e, sz)
	}); err != nil {
		return nil, err
	}
	out := make([]*EPGroup, len(devices))
	for i, raw := range unsafe.Slice(groups, len(devices)) {
		out[i] = newEPGroup(raw)
	}
	return out, nil
}

// call runs f with the group's handle under its exclusive lock and turns the status into an
// error.
func (g *EPGroup) call(f func(raw *C.ft_ep_group) C.ft_status) error {
	return g.h.exclusive(func(raw *C.ft_ep_group) error {
		return check(f(raw), func() string { return C.GoString(C.ft_ep_group_last_error(raw)) })
	})
}

// Info returns the group's rank and topology.
func (g *EPGroup) Info() (EPGroupInfo, error) {
	var i C.ft_ep_group_info
	i.struct_size = C.uint32_t(unsafe.Sizeof(i))
	err := g.call(func(raw *C.ft_ep_group) C.ft_status { return C.ft_ep_group_info_get(raw, &i) })
	return EPGroupInfo{Rank: int(i.rank), Ranks: int(i.ranks), SlotsPerRank: int(i.slots_per_rank), Device: int(i.device),
		NCCLVersion: int(i.nccl_version), PCIBusID: C.GoString(&i.pci_bus_id[0]), NUMANode: int(i.numa_node),
		LinkBytesPerS: float64(i.link_bytes_per_s)}, err
}

// SetPlacement sets phy2log: entry r*SlotsPerRank+s is the logical expert in slot s of rank r.
func (g *EPGroup) SetPlacement(phy2log []int32) error {
	if len(phy2log) == 0 {
		return invalid("empty placement")
	}
	return g.call(func(raw *C.ft_ep_group) C.ft_status {
		return C.ft_ep_group_set_placement(raw, (*C.int32_t)(&phy2log[0]), C.size_t(len(phy2log)))
	})
}

// Placement returns the expert placement.
func (g *EPGroup) Placement() ([]int32, error) {
	var count C.size_t
	if err := g.call(func(raw *C.ft_ep_group) C.ft_status { return C.ft_ep_group_get_placement(raw, nil, 0, &count) }); err != nil {
		return nil, err
	}
	v := make([]int32, int(count)+1)
	err := g.call(func(raw *C.ft_ep_group) C.ft_status {
		return C.ft_ep_group_get_placement(raw, (*C.int32_t)(&v[0]), C.size_t(len(v)), &count)
	})
	return v[:count], err
}

// Close frees the group.
func (g *EPGroup) Close() error {
	g.h.close(func(raw *C.ft_ep_group) { C.ft_ep_group_free(raw) }, "")
	runtime.SetFinalizer(g, nil)
	return nil
}
