// oneDNN bf16 matmul (cached primitives) and the executor's batched path that uses it.
#include <omp.h>

#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "dnnl.hpp"
#include "moe_internal.hpp"

namespace ft::cpu {
namespace {

using dt = dnnl::memory::data_type;

dnnl::engine &cpu_engine() {
    static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    return engine;
}

[[noreturn]] void rethrow_dnnl(const dnnl::error &e, const char *what) {
    const ft_status st = e.status == dnnl_unimplemented ? FT_ERR_UNSUPPORTED
                         : e.status == dnnl_out_of_memory ? FT_ERR_OUT_OF_MEMORY
                                                          : FT_ERR_INTERNAL;
    fail(st, "oneDNN ", what, ": ", e.what(), " (status ", int(e.status), ")");
}

// oneDNN 3 (Ubuntu 24.04) dropped the operation descriptors of oneDNN 2 (Debian 12).
dnnl::matmul::primitive_desc matmul_desc(const dnnl::memory::desc &src, const dnnl::memory::desc &wei,
                                         const dnnl::memory::desc &dst) {
#if DNNL_VERSION_MAJOR >= 3
    return dnnl::matmul::primitive_desc(cpu_engine(), src, wei, dst);
#else
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), cpu_engine());
#endif
}

// (M, N, K, lds, ldw, ldd) -> primitive. Primitives are immutable once created and oneDNN allows
// executing one from several threads, so only the map needs the lock.
using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;

dnnl::matmul &cached_matmul(const Key &key) {
    static std::mutex mutex;
    static std::map<Key, dnnl::matmul> cache;
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    auto [m, n, k, lds, ldw, ldd] = key;
    dnnl::memory::desc src_md({m, k}, dt::bf16, {lds, 1});
    // W is stored [N,K] row-major: as the [K,N] weight oneDNN expects, that is format "ba".
    dnnl::memory::desc wei_md({k, n}, dt::bf16, {1, ldw});
    dnnl::memory::desc dst_md({m, n}, dt::f32, {ldd, 1});
    return cache.emplace(key, dnnl::matmul(matmul_desc(src_md, wei_md, dst_md))).first->second;
}

}  // namespace

int onednn_threads() { return omp_get_max_threads(); }

bool onednn_bf16_available() {
    static const bool available = [] {
        try {
            dnnl::memory::desc src_md({1, 64}, dt::bf16, {64, 1});
            dnnl::memory::desc wei_md({64, 16}, dt::bf16, {1, 64});
            dnnl::memory::desc dst_md({1, 16}, dt::f32, {16, 1});
            matmul_desc(src_md, wei_md, dst_md);
            return true;
        } catch (const dnnl::error &e) {
            log(FT_LOG_INFO, "oneDNN has no bf16 matmul on this CPU (status ", int(e.status),
                "): the CPU backend uses its own kernels for every batch size");
            return false;
        }
    }();
    return available;
}

void onednn_matmul_bf16(int64_t m, int64_t n, int64_t k, const uint16_t *src, int64_t lds, const uint16_t *w,
                        int64_t ldw, float *dst, int64_t ldd) {
    if (m <= 0 || n <= 0 || k <= 0 || lds < k || ldw < k || ldd < n || !src || !w || !dst)
        fail(FT_ERR_INVALID_ARGUMENT, "oneDNN matmul: bad shape M=", m, " N=", n, " K=", k);
    if (!onednn_bf16_available())
        fail(FT_ERR_UNSUPPORTED, "oneDNN matmul: no bf16 matmul on this CPU (needs AVX-512 or newer)");
    try {
        dnnl::matmul &prim = cached_matmul(Key{m, n, k, lds, ldw, ldd});
        dnnl::engine &eng = cpu_engine();
        dnnl::memory::desc src_md({m, k}, dt::bf16, {lds, 1});
        dnnl::memory::desc wei_md({k, n}, dt::bf16, {1, ldw});
        dnnl::memory::desc dst_md({m, n}, dt::f32, {ldd, 1});
        dnnl::memory src_mem(src_md, eng, const_cast<uint16_t *>(src));
        dnnl::memory wei_mem(wei_md, eng, const_cast<uint16_t *>(w));
        dnnl::memory dst_mem(dst_md, eng, dst);
        dnnl::stream strm(eng);
        prim.execute(strm, {{DNNL_ARG_SRC, src_mem}, {DNNL_ARG_WEIGHTS, wei_mem}, {DNNL_ARG_DST, dst_mem}});
        strm.wait();
    } catch (const dnnl::error &e) {
        rethrow_dnnl(e, "matmul");
    } catch (const std::bad_alloc &) {
        fail(FT_ERR_OUT_OF_MEMORY, "oneDNN matmul: out of memory");
    }
}

// Experts with many routes: gate and up as two matmuls into fp32, the activation in parallel on
// the same OpenMP threads, then down straight into the experts' route rows.
void MoeExecutor::run_onednn_groups() {
    Scratch &s = *s_;
    const int64_t H = hidden_;
    for (int32_t gi = 0; gi < s.num_groups; ++gi) {
        const Group &g = s.groups[gi];
        if (!g.onednn) continue;
        const int64_t n = g.count, I = g.inter;
        uint16_t *xg = s.gathered_x.data();
        for (int64_t j = 0; j < n; ++j) std::memcpy(xg + j * H, s.xptr[g.first_slot + j], size_t(H) * 2);
        float *gu = s.gate_up_f32.data();
        onednn_matmul_bf16(n, I, H, xg, H, g.gate, H, gu, 2 * I);
        onednn_matmul_bf16(n, I, H, xg, H, g.up, H, gu + I, 2 * I);
        const ActivationSpec act = act_;
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < n; ++j) {
            const float *row = gu + j * 2 * I;
            uint16_t *dst = g.inter_out + j * I;
            for (int64_t i = 0; i < I; ++i) dst[i] = f32_to_bf16(activate(act, row[i], row[I + i]));
        }
        onednn_matmul_bf16(n, H, I, g.inter_out, I, g.down, I, s.route_out.data() + int64_t(g.first_slot) * H, H);
    }
}

}  // namespace ft::cpu
