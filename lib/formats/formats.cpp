#include "ft/formats.hpp"

#include "ft/common.hpp"

namespace ft {

const char *format_name(Format f) {
    switch (f) {
        case Format::bf16: return "bf16";
    }
    return "unknown";
}

Format parse_format(const std::string &name) {
    if (name == "bf16") return Format::bf16;
    fail(FT_ERR_INVALID_ARGUMENT, "unknown expert format '", name, "' (supported: bf16)");
}

bool format_valid(int32_t value) { return value == FT_FORMAT_BF16; }

std::vector<BankSpec> bank_schema(Format f, int64_t hidden, int64_t intermediate) {
    switch (f) {
        case Format::bf16:
            return {{"gate_up", static_cast<size_t>(2 * intermediate * hidden * 2)},
                    {"down", static_cast<size_t>(hidden * intermediate * 2)}};
    }
    fail(FT_ERR_INTERNAL, "bank_schema: unhandled format");
}

size_t expert_bytes(Format f, int64_t hidden, int64_t intermediate) {
    size_t total = 0;
    for (const BankSpec &b : bank_schema(f, hidden, intermediate)) total += b.row_bytes;
    return total;
}

}  // namespace ft
