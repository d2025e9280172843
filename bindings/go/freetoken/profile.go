package freetoken

/*
#include <freetoken.h>
#include <stdlib.h>

extern bool ftGoProgress(void *user_data, char *phase, uint64_t done, uint64_t total);
static void ft_set_profile_progress(ft_profile_params *p, uintptr_t h) {
    p->progress = (ft_progress_fn)ftGoProgress;
    p->progress_user_data = (void *)h;
}
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// ProfileOptions are options of MeasureProfile; DefaultProfileOptions gives the library's
// defaults.
type ProfileOptions struct {
	Device     int     // DeviceAuto, DeviceNone (CPU only) or a CUDA ordinal
	CPUThreads int     // 0: as engines choose
	Formats    []int   // formats to measure; empty: all
	MaxSeconds float64 // soft bound on the whole run
	Progress   ProgressFunc
}

// DefaultProfileOptions returns the library's defaults.
func DefaultProfileOptions() ProfileOptions {
	var p C.ft_profile_params
	C.ft_profile_params_init(&p)
	return ProfileOptions{Device: int(p.device), CPUThreads: int(p.cpu_threads), MaxSeconds: float64(p.max_seconds)}
}

// ProfileMachine are the machine figures of a profile.
type ProfileMachine struct {
	PhysicalCores, ThreadsUsed int
	CPUReadGBs, H2DGBs, D2HGBs float64
	GPUName, CPUModel          string
}

// ProfileFormat are the figures of one expert format.
type ProfileFormat struct {
	Format                                             int
	ExpertBytes                                        uint64
	CPUGBs, GatherGBs, CPUOverlapGBs, GatherOverlapGBs float64
	FetchFraction                                      float64 // -1 when the figures do not tell
	CPUKernel                                          string
}

// Profile is what this machine's memory, bus and kernels do. Read-only; safe for concurrent use.
type Profile struct {
	h owned[C.ft_profile]
}

func newProfile(raw *C.ft_profile) *Profile {
	p := &Profile{h: owned[C.ft_profile]{raw: raw, what: "the profile"}}
	runtime.SetFinalizer(p, func(p *Profile) { p.Close() })
	return p
}

// MeasureProfile measures the machine (ft_profile_bandwidth); opts nil means the defaults.
func MeasureProfile(opts *ProfileOptions) (*Profile, error) {
	var p C.ft_profile_params
	C.ft_profile_params_init(&p)
	var fn ProgressFunc
	if opts != nil {
		threads, err := toInt32(opts.CPUThreads, "CPUThreads")
		if err != nil {
			return nil, err
		}
		p.device, p.cpu_threads, p.max_seconds = C.int32_t(opts.Device), threads, C.double(opts.MaxSeconds)
		for _, f := range opts.Formats {
			if f < 0 || f >= 32 {
				return nil, invalid("format %d has no bit in the formats mask", f)
			}
			p.formats |= C.uint32_t(1) << uint(f)
		}
		fn = opts.Progress
	}
	done := attachProgress(fn, func(h C.uintptr_t) { C.ft_set_profile_progress(&p, h) })
	var raw *C.ft_profile
	err := withErrBuf(func(e *C.char, n C.size_t) C.ft_status { return C.ft_profile_bandwidth(&p, &raw, e, n) })
	done()
	if err != nil {
		return nil, err
	}
	return newProfile(raw), nil
}

func optPath(path string) (*C.char, func()) {
	if path == "" {
		return nil, func() {}
	}
	c := C.CString(path)
	return c, func() { C.free(unsafe.Pointer(c)) }
}

// LoadProfile reads a profile; path "" means $FT_PROFILE_PATH, else the default cache path.
func LoadProfile(path string) (*Profile, error) {
	c, free := optPath(path)
	defer free()
	var raw *C.ft_profile
	if err := withErrBuf(func(e *C.char, n C.size_t) C.ft_status { return C.ft_profile_load(c, &raw, e, n) }); err != nil {
		return nil, err
	}
	return newProfile(raw), nil
}

// Save writes the profile atomically; path "" means the default path.
func (p *Profile) Save(path string) error {
	c, free := optPath(path)
	defer free()
	return p.h.shared(func(raw *C.ft_profile) error {
		return withErrBuf(func(e *C.char, n C.size_t) C.ft_status { return C.ft_profile_save(raw, c, e, n) })
	})
}

// Machine returns the machine figures.
func (p *Profile) Machine() (pm ProfileMachine, err error) {
	err = p.h.shared(func(raw *C.ft_profile) error {
		var m C.ft_profile_machine
		m.struct_size = C.uint32_t(unsafe.Sizeof(m))
		s := C.ft_profile_get_machine(raw, &m)
		if err := check(s, func() string { return "ft_profile_get_machine failed" }); err != nil {
			return err
		}
		pm = ProfileMachine{PhysicalCores: int(m.physical_cores), ThreadsUsed: int(m.threads_used),
			CPUReadGBs: float64(m.cpu_read_gbs), H2DGBs: float64(m.h2d_gbs), D2HGBs: float64(m.d2h_gbs),
			GPUName: C.GoString(m.gpu_name), CPUModel: C.GoString(m.cpu_model)}
		return nil
	})
	return pm, err
}

// Format returns the figures of one format; StatusUnsupported when the profile has none.
func (p *Profile) Format(format int) (pf ProfileFormat, err error) {
	err = p.h.shared(func(raw *C.ft_profile) error {
		var f C.ft_profile_format
		f.struct_size = C.uint32_t(unsafe.Sizeof(f))
		s := C.ft_profile_get_format(raw, C.int32_t(format), &f)
		if err := check(s, func() string { return "the profile has no figures for this format" }); err != nil {
			return err
		}
		pf = ProfileFormat{Format: int(f.format), ExpertBytes: uint64(f.expert_bytes), CPUGBs: float64(f.cpu_gbs),
			GatherGBs: float64(f.gather_gbs), CPUOverlapGBs: float64(f.cpu_overlap_gbs),
			GatherOverlapGBs: float64(f.gather_overlap_gbs), FetchFraction: float64(f.fetch_fraction),
			CPUKernel: C.GoString(f.cpu_kernel)}
		return nil
	})
	return pf, err
}

// Close frees the profile.
func (p *Profile) Close() error {
	p.h.close(func(raw *C.ft_profile) { C.ft_profile_free(raw) }, "")
	runtime.SetFinalizer(p, nil)
	return nil
}
