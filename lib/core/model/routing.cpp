// Routing rules (docs/formulas.md, "Routing"): router logits -> top-k expert ids and their weights.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "ft/common.hpp"
#include "ft/model.hpp"

namespace ft {

namespace {

// Indices of the k largest scores among `candidates`, by decreasing score, ties to the lower id.
void top_k(const std::vector<double> &score, std::vector<int32_t> &candidates, int32_t k) {
    auto better = [&](int32_t a, int32_t b) { return score[a] > score[b] || (score[a] == score[b] && a < b); };
    std::partial_sort(candidates.begin(), candidates.begin() + k, candidates.end(), better);
    candidates.resize(static_cast<size_t>(k));
}

// Writes the k chosen experts (cand[0..k)) and their weights `value[e]`, renormalised over the k
// when the rule asks, times the routed scaling factor.
void write_scaled(const RoutingSpec &r, const std::vector<int32_t> &cand, const std::vector<double> &value,
                  int32_t *ids, float *weights) {
    double sum = 0.0;
    for (int32_t k = 0; k < r.top_k; ++k) sum += value[cand[k]];
    const double scale = r.routed_scaling_factor / (r.renormalize ? sum + 1e-20 : 1.0);
    for (int32_t k = 0; k < r.top_k; ++k) {
        ids[k] = cand[k];
        weights[k] = static_cast<float>(value[cand[k]] * scale);
    }
}

void softmax_then_topk(const RoutingSpec &r, const float *logits, int32_t *ids, float *weights,
                       std::vector<double> &score, std::vector<int32_t> &cand) {
    const int32_t E = r.num_experts, K = r.top_k;
    double mx = -INFINITY;
    for (int32_t e = 0; e < E; ++e) mx = std::max(mx, static_cast<double>(logits[e]));
    double sum = 0.0;
    for (int32_t e = 0; e < E; ++e) sum += (score[e] = std::exp(static_cast<double>(logits[e]) - mx));
    for (int32_t e = 0; e < E; ++e) score[e] /= sum;
    cand.resize(static_cast<size_t>(E));
    std::iota(cand.begin(), cand.end(), 0);
    top_k(score, cand, K);
    for (int32_t k = 0; k < K; ++k) {
        ids[k] = cand[k];
        weights[k] = static_cast<float>(score[cand[k]]);
    }
}

// top-k of the logits, softmax over the k chosen (equal to softmax, top-k, renormalise).
void topk_then_softmax(const RoutingSpec &r, const float *logits, int32_t *ids, float *weights,
                       std::vector<double> &score, std::vector<int32_t> &cand) {
    const int32_t E = r.num_experts, K = r.top_k;
    for (int32_t e = 0; e < E; ++e) score[e] = logits[e];
    cand.resize(static_cast<size_t>(E));
    std::iota(cand.begin(), cand.end(), 0);
    top_k(score, cand, K);
    const double mx = score[cand[0]];
    double sum = 0.0;
    for (int32_t k = 0; k < K; ++k) sum += std::exp(score[cand[k]] - mx);
    for (int32_t k = 0; k < K; ++k) {
        ids[k] = cand[k];
        weights[k] = static_cast<float>(std::exp(score[cand[k]] - mx) / sum);
    }
}

// Llama-4: top-k of the logits, each weighted by sigmoid(logit).
void topk_then_sigmoid(const RoutingSpec &r, const float *logits, int32_t *ids, float *weights,
                       std::vector<double> &score, std::vector<int32_t> &cand) {
    const int32_t E = r.num_experts, K = r.top_k;
    for (int32_t e = 0; e < E; ++e) score[e] = logits[e];
    cand.resize(static_cast<size_t>(E));
    std::iota(cand.begin(), cand.end(), 0);
    top_k(score, cand, K);
    for (int32_t k = 0; k < K; ++k) {
        ids[k] = cand[k];
        weights[k] = static_cast<float>(1.0 / (1.0 + std::exp(-score[cand[k]])));
    }
}

// softmax probabilities of one row of logits into `p`.
void softmax_row(int32_t E, const float *logits, std::vector<double> &p) {
    double mx = -INFINITY;
    for (int32_t e = 0; e < E; ++e) mx = std::max(mx, static_cast<double>(logits[e]));
    double sum = 0.0;
    for (int32_t e = 0; e < E; ++e) sum += (p[e] = std::exp(static_cast<double>(logits[e]) - mx));
    for (int32_t e = 0; e < E; ++e) p[e] /= sum;
}

// The experts of the `keep` groups (of `groups` equal groups) whose group score is highest,
// in id order; group_score(g) scores group g.
template <class GroupScore>
void best_groups(int32_t E, int32_t groups, int32_t keep, GroupScore group_score, std::vector<int32_t> &cand) {
    const int32_t per_group = E / groups;
    std::vector<double> gs(static_cast<size_t>(groups));
    for (int32_t g = 0; g < groups; ++g) gs[g] = group_score(g * per_group, (g + 1) * per_group);
    std::vector<int32_t> chosen(static_cast<size_t>(groups));
    std::iota(chosen.begin(), chosen.end(), 0);
    top_k(gs, chosen, keep);
    std::sort(chosen.begin(), chosen.end());
    cand.clear();
    for (int32_t g : chosen)
        for (int32_t e = g * per_group; e < (g + 1) * per_group; ++e) cand.push_back(e);
}

// DeepSeek-V2: softmax probabilities; top-k within the groups whose best probability is highest
// (all experts with one group); weights the probabilities, optionally renormalised, scaled.
void softmax_group_topk(const RoutingSpec &r, const float *logits, int32_t *ids, float *weights,
                        std::vector<double> &p, std::vector<int32_t> &cand) {
    const int32_t E = r.num_experts, K = r.top_k;
    softmax_row(E, logits, p);
    if (r.num_groups > 1) {
        best_groups(E, r.num_groups, r.topk_groups, [&](int32_t b, int32_t e) {
            return *std::max_element(p.begin() + b, p.begin() + e);
        }, cand);
    } else {
        cand.resize(static_cast<size_t>(E));
        std::iota(cand.begin(), cand.end(), 0);
    }
    top_k(p, cand, K);
    write_scaled(r, cand, p, ids, weights);
}

// PhiMoE's inference routing (two routes): each route takes the best logit m not taken yet and
// weighs it by its softmax among the remaining logits s with (m - s) / max(|s|, m) <= 2 eps.
void sparsemixer(const RoutingSpec &r, const float *logits, int32_t *ids, float *weights) {
    const int32_t E = r.num_experts;
    const double two_eps = 2.0 * static_cast<double>(r.jitter_eps);
    int32_t taken = -1;
    for (int32_t k = 0; k < 2; ++k) {
        int32_t best = -1;
        for (int32_t e = 0; e < E; ++e)
            if (e != taken && (best < 0 || logits[e] > logits[best])) best = e;
        const double m = logits[best];
        double sum = 0.0;
        for (int32_t e = 0; e < E; ++e) {
            if (e == taken) continue;
            const double s = logits[e];
            // The same comparison as the reference (a NaN ratio, 0 / 0, keeps the expert).
            if ((m - s) / std::max(std::fabs(s), m) > two_eps) continue;
            sum += std::exp(s - m);
        }
        ids[k] = best;
        weights[k] = static_cast<float>(1.0 / sum);
        taken = best;
    }
}

// DeepSeek-V3 / GLM-4.x / Kimi-K2 (sigmoid scores), DeepSeek-V4 (sqrt(softplus) scores) and
// ERNIE-4.5 (softmax scores): biased selection within the best groups, unbiased weights,
// optional renormalisation, routed scaling.
void biased_group_topk(const RoutingSpec &r, const float *bias, const float *logits, int32_t *ids,
                       float *weights, std::vector<double> &sig, std::vector<double> &biased,
                       std::vector<int32_t> &cand) {
    const int32_t E = r.num_experts, K = r.top_k;
    const bool sqrt_softplus = r.rule == FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK;
    if (r.rule == FT_ROUTING_SOFTMAX_BIASED_TOPK) softmax_row(E, logits, sig);
    for (int32_t e = 0; e < E; ++e) {
        const double x = logits[e];
        // log1p(exp(x)) overflows for large x, where softplus(x) is x to double precision.
        if (r.rule != FT_ROUTING_SOFTMAX_BIASED_TOPK)
            sig[e] = sqrt_softplus ? std::sqrt(x > 30.0 ? x : std::log1p(std::exp(x))) : 1.0 / (1.0 + std::exp(-x));
        biased[e] = sig[e] + (bias ? static_cast<double>(bias[e]) : 0.0);
    }
    cand.clear();
    if (r.num_groups > 1) {
        const int32_t per_group = E / r.num_groups;
        // Group score: the sum of the group's two best biased scores.
        std::vector<double> group_score(static_cast<size_t>(r.num_groups));
        for (int32_t g = 0; g < r.num_groups; ++g) {
            double best = -INFINITY, second = -INFINITY;
            for (int32_t e = g * per_group; e < (g + 1) * per_group; ++e) {
                if (biased[e] > best) {
                    second = best;
                    best = biased[e];
                } else if (biased[e] > second) {
                    second = biased[e];
                }
            }
            group_score[g] = best + second;
        }
        std::vector<int32_t> groups(static_cast<size_t>(r.num_groups));
        std::iota(groups.begin(), groups.end(), 0);
        top_k(group_score, groups, r.topk_groups);
        std::sort(groups.begin(), groups.end());
        for (int32_t g : groups) {
            for (int32_t e = g * per_group; e < (g + 1) * per_group; ++e) cand.push_back(e);
        }
    } else {
        cand.resize(static_cast<size_t>(E));
        std::iota(cand.begin(), cand.end(), 0);
    }
    top_k(biased, cand, K);
    write_scaled(r, cand, sig, ids, weights);
}

}  // namespace

void route(const RoutingSpec &r, const float *bias, int32_t num_tokens, const float *logits, int32_t *ids,
           float *weights) {
    const int32_t E = r.num_experts, K = r.top_k;
    if (E <= 0 || K <= 0 || K > E) fail(FT_ERR_INVALID_ARGUMENT, "routing: top_k ", K, " of ", E, " experts");
    if (bias) {
        for (int32_t e = 0; e < E; ++e) {
            if (!std::isfinite(bias[e])) fail(FT_ERR_NON_FINITE, "routing: correction bias of expert ", e, " is not finite");
        }
    }
    std::vector<double> a(static_cast<size_t>(E)), b(static_cast<size_t>(E));
    std::vector<int32_t> cand;
    cand.reserve(static_cast<size_t>(E));
    for (int32_t t = 0; t < num_tokens; ++t) {
        const float *row = logits + static_cast<size_t>(t) * E;
        for (int32_t e = 0; e < E; ++e) {
            if (!std::isfinite(row[e])) fail(FT_ERR_NON_FINITE, "routing: logit of token ", t, ", expert ", e, " is ", row[e]);
        }
        int32_t *ids_t = ids + static_cast<size_t>(t) * K;
        float *w_t = weights + static_cast<size_t>(t) * K;
        switch (r.rule) {
            case FT_ROUTING_SOFTMAX_TOPK: softmax_then_topk(r, row, ids_t, w_t, a, cand); break;
            case FT_ROUTING_SOFTMAX_TOPK_RENORM:
            case FT_ROUTING_TOPK_SOFTMAX: topk_then_softmax(r, row, ids_t, w_t, a, cand); break;
            case FT_ROUTING_SIGMOID_GROUP_TOPK:
            case FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK:
            case FT_ROUTING_SOFTMAX_BIASED_TOPK: biased_group_topk(r, bias, row, ids_t, w_t, a, b, cand); break;
            case FT_ROUTING_TOPK_SIGMOID: topk_then_sigmoid(r, row, ids_t, w_t, a, cand); break;
            case FT_ROUTING_SOFTMAX_GROUP_TOPK: softmax_group_topk(r, row, ids_t, w_t, a, cand); break;
            case FT_ROUTING_SPARSEMIXER:
                if (K != 2) fail(FT_ERR_INVALID_ARGUMENT, "routing: FT_ROUTING_SPARSEMIXER routes 2 experts, not ", K);
                sparsemixer(r, row, ids_t, w_t);
                break;
            default: fail(FT_ERR_INVALID_ARGUMENT, "routing: unknown rule ", r.rule);
        }
    }
}

void route_hash(const RoutingSpec &r, const int32_t *table, int32_t vocab, int32_t num_tokens, const float *logits,
                const int32_t *token_ids, int32_t *ids, float *weights) {
    const int32_t E = r.num_experts, K = r.top_k;
    if (E <= 0 || K <= 0 || K > E) fail(FT_ERR_INVALID_ARGUMENT, "routing: top_k ", K, " of ", E, " experts");
    const bool softmax = r.rule == FT_ROUTING_SOFTMAX_TOPK || r.rule == FT_ROUTING_SOFTMAX_BIASED_TOPK;
    const bool sqrt_softplus = r.rule == FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK;
    if (!softmax && !sqrt_softplus && r.rule != FT_ROUTING_SIGMOID_GROUP_TOPK)
        fail(FT_ERR_INVALID_ARGUMENT, "routing: hash routing takes softmax, sigmoid or sqrt(softplus) scores, not rule ",
             r.rule);
    std::vector<double> p(static_cast<size_t>(E));
    for (int32_t t = 0; t < num_tokens; ++t) {
        const float *row = logits + static_cast<size_t>(t) * E;
        for (int32_t e = 0; e < E; ++e) {
            if (!std::isfinite(row[e])) fail(FT_ERR_NON_FINITE, "routing: logit of token ", t, ", expert ", e, " is ", row[e]);
        }
        const int32_t tok = token_ids[t];
        if (tok < 0 || tok >= vocab)
            fail(FT_ERR_INVALID_ARGUMENT, "routing: token ", t, " has token id ", tok, " outside [0, ", vocab, ")");
        const int32_t *chosen = table + static_cast<size_t>(tok) * K;
        if (softmax) softmax_row(E, row, p);
        double sum = 0.0;
        for (int32_t k = 0; k < K; ++k) {
            const int32_t e = chosen[k];
            if (e < 0 || e >= E) fail(FT_ERR_INTERNAL, "routing: tid2eid row ", tok, " names expert ", e);
            if (!softmax) {
                const double x = row[e];
                // log1p(exp(x)) overflows for large x, where softplus(x) is x to double precision.
                p[e] = sqrt_softplus ? std::sqrt(x > 30.0 ? x : std::log1p(std::exp(x))) : 1.0 / (1.0 + std::exp(-x));
            }
            sum += p[e];
        }
        const double scale = r.routed_scaling_factor / (softmax ? 1.0 : sum + 1e-20);
        for (int32_t k = 0; k < K; ++k) {
            ids[static_cast<size_t>(t) * K + k] = chosen[k];
            weights[static_cast<size_t>(t) * K + k] = static_cast<float>(p[chosen[k]] * scale);
        }
    }
}

}  // namespace ft
