// An fp64 reference of the routing rules (docs/formulas.md, "Routing"), written independently of lib/core/model/routing.cpp:
// full sorts and explicit masks instead of partial selection.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "freetoken.h"

namespace ft::test {

struct RefRoute {
    std::vector<int32_t> ids;
    std::vector<double> weights;
};

inline std::vector<int32_t> ref_order(const std::vector<double> &score, const std::vector<bool> &allowed) {
    std::vector<int32_t> idx;
    for (int32_t e = 0; e < static_cast<int32_t>(score.size()); ++e)
        if (allowed[e]) idx.push_back(e);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return score[a] > score[b]; });
    return idx;
}

// One token. bias may be empty.
inline RefRoute ref_route(int32_t rule, int32_t K, const std::vector<double> &logits, const std::vector<double> &bias,
                          int32_t groups = 1, int32_t topk_groups = 1, double scale = 1.0, bool renorm = true) {
    const int32_t E = static_cast<int32_t>(logits.size());
    RefRoute r;
    std::vector<bool> all(E, true);
    if (rule == FT_ROUTING_SOFTMAX_TOPK || rule == FT_ROUTING_SOFTMAX_TOPK_RENORM || rule == FT_ROUTING_TOPK_SOFTMAX) {
        const double mx = *std::max_element(logits.begin(), logits.end());
        std::vector<double> p(E);
        double z = 0;
        for (int32_t e = 0; e < E; ++e) z += p[e] = std::exp(logits[e] - mx);
        for (double &v : p) v /= z;
        const auto order = ref_order(p, all);
        double sel = 0;
        for (int32_t k = 0; k < K; ++k) sel += p[order[k]];
        for (int32_t k = 0; k < K; ++k) {
            r.ids.push_back(order[k]);
            r.weights.push_back(rule == FT_ROUTING_SOFTMAX_TOPK ? p[order[k]] : p[order[k]] / sel);
        }
        return r;
    }
    // FT_ROUTING_SIGMOID_GROUP_TOPK and FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK
    std::vector<double> s(E), b(E);
    for (int32_t e = 0; e < E; ++e) {
        s[e] = rule == FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK ? std::sqrt(std::log(1.0 + std::exp(logits[e])))
                                                          : 1.0 / (1.0 + std::exp(-logits[e]));
        b[e] = s[e] + (bias.empty() ? 0.0 : bias[e]);
    }
    std::vector<bool> allowed(E, true);
    if (groups > 1) {
        const int32_t per = E / groups;
        std::vector<double> gs(groups);
        for (int32_t g = 0; g < groups; ++g) {
            std::vector<double> members(b.begin() + g * per, b.begin() + (g + 1) * per);
            std::sort(members.rbegin(), members.rend());
            gs[g] = members[0] + members[1];
        }
        const auto gorder = ref_order(gs, std::vector<bool>(groups, true));
        std::vector<bool> keep(groups, false);
        for (int32_t i = 0; i < topk_groups; ++i) keep[gorder[i]] = true;
        for (int32_t e = 0; e < E; ++e) allowed[e] = keep[e / per];
    }
    const auto order = ref_order(b, allowed);
    double sum = 0;
    for (int32_t k = 0; k < K; ++k) sum += s[order[k]];
    for (int32_t k = 0; k < K; ++k) {
        r.ids.push_back(order[k]);
        r.weights.push_back(s[order[k]] * scale / (renorm ? sum + 1e-20 : 1.0));
    }
    return r;
}

}  // namespace ft::test
