#include "ft/selector.hpp"

#include "ft/common.hpp"

namespace ft {

namespace {

struct BackendEntry {
    int32_t id;
    const char *name;
    // Empty string: available. Otherwise the reason it is not.
    std::string (*unavailable)(const MachineCaps &, const ModelSpec &);
};

std::string cpu_unavailable(const MachineCaps &caps, const ModelSpec &model) {
    // Every expert format has CPU kernels (cpu/README.md); only unknown values are refused.
    (void)caps;
    if (!format_known(static_cast<int32_t>(model.format))) return cat("no CPU kernel for format ", static_cast<int32_t>(model.format));
    return {};
}

// Preference order for `auto`: first available wins.
const BackendEntry kBackends[] = {
    {FT_BACKEND_CPU, "cpu", cpu_unavailable},
};

}  // namespace

const char *backend_name(int32_t backend) {
    if (backend == FT_BACKEND_AUTO) return "auto";
    for (const BackendEntry &b : kBackends) {
        if (b.id == backend) return b.name;
    }
    return "unknown";
}

BackendChoice select_backend(int32_t requested, const MachineCaps &caps, const ModelSpec &model) {
    if (requested == FT_BACKEND_AUTO) {
        std::string reasons;
        for (const BackendEntry &b : kBackends) {
            const std::string why = b.unavailable(caps, model);
            if (why.empty()) {
                return {b.id, cat("auto: ", b.name, " is the first available backend",
                                  reasons.empty() ? "" : " (", reasons, reasons.empty() ? "" : ")")};
            }
            reasons += cat(reasons.empty() ? "" : "; ", b.name, ": ", why);
        }
        fail(FT_ERR_UNSUPPORTED, "no backend can run this model: ", reasons);
    }
    for (const BackendEntry &b : kBackends) {
        if (b.id != requested) continue;
        const std::string why = b.unavailable(caps, model);
        if (!why.empty()) fail(FT_ERR_UNSUPPORTED, "backend ", b.name, " cannot run this model: ", why);
        return {b.id, cat(b.name, " requested")};
    }
    fail(FT_ERR_INVALID_ARGUMENT, "unknown backend ", requested);
}

}  // namespace ft
