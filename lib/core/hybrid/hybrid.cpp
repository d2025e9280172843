#include "ft/hybrid.hpp"

#include <cmath>

namespace ft {

int32_t fraction_to_q16(double fraction) {
    if (!(fraction > 0.0)) return 0;
    if (fraction >= 1.0) return 65536;
    return static_cast<int32_t>(std::lround(fraction * 65536.0));
}

double fraction_for_fetch(int64_t fetch, int64_t missing) {
    if (missing <= 0) return 0.0;
    const int64_t f = fetch < 0 ? 0 : (fetch > missing ? missing : fetch);
    return (static_cast<double>(f) + 0.5) / static_cast<double>(missing + 1);
}

}  // namespace ft
