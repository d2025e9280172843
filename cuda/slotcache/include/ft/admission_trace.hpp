// Phase stamps of the admission kernel, for bench_admission_trace: admission.cu built with
// FT_ADMISSION_TRACE stamps clock64() (thread 0) at each point below and keeps the stamps of the
// last kTraceCalls calls, row step % kTraceCalls, as cycles since kTraceEntry. Without the macro
// nothing is stamped and admission_trace_copy does not exist.
#pragma once

#include <cuda_runtime_api.h>

namespace ft::cuda {

enum TracePoint : int {
    kTraceEntry,       // kernel entry, before pdl_wait
    kTraceWaited,      // after pdl_wait
    kTraceInit,        // after the first barrier (flags cleared)
    kTraceActive,      // after the active-set barrier (clock advanced)
    kTraceLookup,      // after the lookup barrier (hits stamped, misses counted)
    kTraceKeys,        // threshold path: thread 0 has its keys and the warp minimum (no barrier)
    kTraceMinima,      // fast and threshold paths: after the first barrier of the victim search
    kTraceThreshold,   // threshold path: after the threshold's barrier
    kTraceCandidates,  // threshold path: after the candidates' barrier
    kTraceMerged,      // fast path: warp 0 after steps 3-4, before the installs; threshold: ranked
    kTraceInstalled,   // fast path: after the round's last barrier
    kTraceEnd,         // after the rewrite
    kTracePath,        // not a time: the kTracePath* bits of the victim paths taken
    kTracePoints
};

inline constexpr const char *kTracePointNames[kTracePoints] = {
    "entry",      "waited", "init",   "active",    "lookup", "keys", "minima",
    "threshold", "candidates", "merged", "installed", "end", "path"};

// Bits of the kTracePath entry.
inline constexpr long long kTracePathShortcut = 1;   // fast path, step 4 skipped
inline constexpr long long kTracePathStep4 = 2;      // fast path, step 4 run
inline constexpr long long kTracePathGeneral = 4;    // general path
inline constexpr long long kTracePathThreshold = 8;  // threshold path ranked the candidates

inline constexpr int kTraceCalls = 256;

#ifdef FT_ADMISSION_TRACE
// Copies the kTraceCalls x kTracePoints stamps to `host`.
cudaError_t admission_trace_copy(long long *host);
#endif

}  // namespace ft::cuda
