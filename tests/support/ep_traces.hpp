// Shared by the EP tests and benchmarks: a seeded routing trace with Zipf-like expert
// popularity and co-activated pairs, random routings with masked and repeated routes, and the
// memcpy transport double that stands in for NCCL's grouped send/recv.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ft::test {

// Uniform doubles and integers from mt19937_64's raw bits (std:: distributions differ between
// standard libraries; the traces must not).
class Rng {
public:
    explicit Rng(uint64_t seed) : g_(seed) {}
    double uniform() { return static_cast<double>(g_() >> 11) * 0x1p-53; }
    int64_t below(int64_t n) { return static_cast<int64_t>(uniform() * static_cast<double>(n)); }
    uint64_t bits() { return g_(); }

private:
    std::mt19937_64 g_;
};

template <typename T>
void shuffle(std::vector<T> &v, Rng &rng) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[static_cast<size_t>(rng.below(static_cast<int64_t>(i)))]);
}

struct TraceSpec {
    int32_t experts = 128;
    int32_t top_k = 8;
    int64_t tokens = 4096;
    double zipf_exponent = 1.0;  // popularity of the i-th most popular expert ~ 1 / (i + 1)^s
    double pair_probability = 0.5;  // after picking e, also pick its partner with this probability
    uint64_t seed = 1;
};

// [tokens, top_k] distinct expert ids per token. Popularity ranks and the pairing are seeded
// permutations, so hot experts are not simply the low ids (which would flatter contiguous
// placement).
inline std::vector<int32_t> routing_trace(const TraceSpec &spec) {
    Rng rng(spec.seed);
    const int32_t E = spec.experts, K = spec.top_k;
    std::vector<int32_t> by_rank(E), pairing(E), partner(E);
    for (int32_t e = 0; e < E; ++e) by_rank[e] = pairing[e] = e;
    shuffle(by_rank, rng);
    shuffle(pairing, rng);
    for (int32_t i = 0; i + 1 < E; i += 2) {
        partner[pairing[i]] = pairing[i + 1];
        partner[pairing[i + 1]] = pairing[i];
    }
    if (E % 2) partner[pairing[E - 1]] = pairing[E - 1];
    std::vector<double> cdf(E);
    double z = 0;
    for (int32_t i = 0; i < E; ++i) cdf[i] = z += 1.0 / std::pow(i + 1.0, spec.zipf_exponent);
    for (double &c : cdf) c /= z;
    std::vector<int32_t> ids(static_cast<size_t>(spec.tokens) * K);
    std::vector<uint8_t> taken(E);
    for (int64_t t = 0; t < spec.tokens; ++t) {
        std::fill(taken.begin(), taken.end(), 0);
        int32_t *row = ids.data() + t * K;
        int32_t n = 0;
        while (n < K) {
            const double u = rng.uniform();
            const int32_t i = static_cast<int32_t>(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
            const int32_t e = by_rank[std::min(i, E - 1)];
            if (taken[e]) continue;
            taken[e] = 1;
            row[n++] = e;
            if (n < K && !taken[partner[e]] && rng.uniform() < spec.pair_probability) {
                taken[partner[e]] = 1;
                row[n++] = partner[e];
            }
        }
    }
    return ids;
}

// Per-expert token counts and the symmetric co-activation matrix of a routing (ids < 0 skipped).
inline void routing_stats(const std::vector<int32_t> &ids, int32_t experts, int32_t top_k, std::vector<double> &load,
                          std::vector<double> &coact) {
    load.assign(experts, 0.0);
    coact.assign(static_cast<size_t>(experts) * experts, 0.0);
    for (size_t t = 0; t < ids.size() / top_k; ++t)
        for (int32_t a = 0; a < top_k; ++a) {
            const int32_t e = ids[t * top_k + a];
            if (e < 0) continue;
            load[e] += 1;
            for (int32_t b = a + 1; b < top_k; ++b) {
                const int32_t f = ids[t * top_k + b];
                if (f < 0 || f == e) continue;
                coact[static_cast<size_t>(e) * experts + f] += 1;
                coact[static_cast<size_t>(f) * experts + e] += 1;
            }
        }
}

// Uniform random routing with masked (-1) and repeated routes, as the layout must survive both.
inline std::vector<int32_t> random_routing(Rng &rng, int64_t tokens, int32_t top_k, int32_t experts,
                                           double masked = 0.1, double repeated = 0.05) {
    std::vector<int32_t> ids(static_cast<size_t>(tokens) * top_k);
    for (int64_t t = 0; t < tokens; ++t)
        for (int32_t j = 0; j < top_k; ++j) {
            int32_t &id = ids[t * top_k + j];
            const double u = rng.uniform();
            if (u < masked)
                id = -1;
            else if (j > 0 && u < masked + repeated)
                id = ids[t * top_k + rng.below(j)];
            else
                id = static_cast<int32_t>(rng.below(experts));
        }
    return ids;
}

// The exchange behind the interface NCCL serves in production: inside a group every rank posts
// sends and receives per peer; at the group's end the k-th send from s to d is matched with the
// k-th receive on d from s. A size mismatch is a protocol bug (sender and receiver disagree on the
// layout) and throws instead of being papered over.
class Transport {
public:
    virtual ~Transport() = default;
    virtual void send(int32_t rank, int32_t peer, const void *data, size_t bytes) = 0;
    virtual void recv(int32_t rank, int32_t peer, void *data, size_t bytes) = 0;
    virtual void group_end() = 0;
};

// Test double: memcpy between buffers of ranks living in one process.
class MemcpyTransport : public Transport {
public:
    explicit MemcpyTransport(int32_t ranks) : ranks_(ranks) {}
    void send(int32_t rank, int32_t peer, const void *data, size_t bytes) override {
        check(rank, peer);
        sends_[{rank, peer}].push_back({data, bytes});
    }
    void recv(int32_t rank, int32_t peer, void *data, size_t bytes) override {
        check(rank, peer);
        recvs_[{peer, rank}].push_back({data, bytes});
    }
    void group_end() override {
        for (auto &[key, q] : sends_) {
            auto &r = recvs_[key];
            if (r.size() != q.size())
                throw std::runtime_error("transport: " + std::to_string(q.size()) + " sends vs " +
                                         std::to_string(r.size()) + " receives on " + std::to_string(key.first) +
                                         " -> " + std::to_string(key.second));
            for (size_t i = 0; i < q.size(); ++i) {
                if (q[i].second != r[i].second)
                    throw std::runtime_error("transport: send of " + std::to_string(q[i].second) + " bytes met a receive of " +
                                             std::to_string(r[i].second) + " on " + std::to_string(key.first) + " -> " +
                                             std::to_string(key.second));
                if (q[i].second) std::memcpy(const_cast<void *>(r[i].first), q[i].first, q[i].second);
                if (key.first != key.second) remote_bytes_ += q[i].second;
            }
            r.clear();
        }
        for (auto &[key, r] : recvs_)
            if (!r.empty()) throw std::runtime_error("transport: a receive on " + std::to_string(key.first) + " -> " +
                                                     std::to_string(key.second) + " has no send");
        sends_.clear();
        recvs_.clear();
        ++groups_;
    }
    size_t remote_bytes() const { return remote_bytes_; }
    int64_t groups() const { return groups_; }

private:
    void check(int32_t rank, int32_t peer) const {
        if (rank < 0 || rank >= ranks_ || peer < 0 || peer >= ranks_) throw std::runtime_error("transport: bad rank");
    }
    int32_t ranks_;
    std::map<std::pair<int32_t, int32_t>, std::vector<std::pair<const void *, size_t>>> sends_, recvs_;
    size_t remote_bytes_ = 0;
    int64_t groups_ = 0;
};

}  // namespace ft::test
