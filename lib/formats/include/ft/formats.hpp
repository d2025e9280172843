// Expert weight formats: the banks each format stores per expert (spec 3.1) and their sizes.
// Every format's scalar reference dequantisation lives here too, in one place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "freetoken.h"

namespace ft {

enum class Format : int32_t { bf16 = FT_FORMAT_BF16 };

const char *format_name(Format f);
// Parses "bf16"; throws FT_ERR_INVALID_ARGUMENT for unknown names.
Format parse_format(const std::string &name);
bool format_valid(int32_t value);

// One bank of a format: `row_bytes` bytes per expert, the same in every layer.
struct BankSpec {
    std::string name;
    size_t row_bytes = 0;
};

// Banks in registration order. bf16: gate_up [2I, H] (gate rows first, then up rows), down [H, I].
std::vector<BankSpec> bank_schema(Format f, int64_t hidden, int64_t intermediate);

// Bytes of one expert across all banks of the format.
size_t expert_bytes(Format f, int64_t hidden, int64_t intermediate);

}  // namespace ft
