#include "ft/hybrid.hpp"

#include <cmath>

namespace ft {

int32_t fraction_to_q16(double fraction) {
    if (!(fraction > 0.0)) return 0;
    if (fraction >= 1.0) return 65536;
    return static_cast<int32_t>(std::lround(fraction * 65536.0));
}

}  // namespace ft
