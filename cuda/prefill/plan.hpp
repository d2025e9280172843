// Host plan of one prefill call (private to cuda/prefill, host-only so a CPU test can check it):
// valid routes sorted by (slot, route) become rows; each slot's rows are cut into pieces of at
// most chunk_rows; consecutive pieces form chunks of at most chunk_rows rows and chunk_experts
// distinct slots (the experts dequantised together).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace ft::cuda::prefill {

struct Piece {
    int32_t slot, row0, rows;
    int32_t dq;  // the slot's index among its chunk's distinct slots (its dequantised expert)
};

struct Chunk {
    int32_t piece0 = 0, pieces = 0;  // pieces [piece0, piece0 + pieces)
    int32_t row0 = 0, rows = 0;      // rows [row0, row0 + rows)
    int32_t slot0 = 0, nslots = 0;   // distinct slots chunk_slots[slot0 .. slot0 + nslots)
};

struct Plan {
    std::vector<uint64_t> keys;  // scratch: (slot << 32) | route
    std::vector<int32_t> row_token, row_route, row_slot;
    std::vector<Piece> pieces;
    std::vector<Chunk> chunks;
    std::vector<int32_t> chunk_slots;

    int64_t rows() const { return int64_t(row_route.size()); }

    // slots [routes] (route r = t * top_k + k; < 0 skipped); chunk_rows, chunk_experts >= 1.
    void build(const int32_t *slots, int64_t routes, int32_t top_k, int32_t chunk_rows, int32_t chunk_experts) {
        keys.clear();
        for (int64_t r = 0; r < routes; ++r)
            if (slots[r] >= 0) keys.push_back((uint64_t(uint32_t(slots[r])) << 32) | uint64_t(r));
        std::sort(keys.begin(), keys.end());
        const int64_t n = int64_t(keys.size());
        row_token.resize(n), row_route.resize(n), row_slot.resize(n);
        for (int64_t j = 0; j < n; ++j) {
            const int32_t r = int32_t(keys[j] & 0xffffffffu);
            row_route[j] = r;
            row_token[j] = r / top_k;
            row_slot[j] = int32_t(keys[j] >> 32);
        }
        pieces.clear();
        for (int64_t a = 0; a < n;) {
            int64_t b = a;
            while (b < n && row_slot[b] == row_slot[a]) ++b;
            for (int64_t c = a; c < b; c += chunk_rows)
                pieces.push_back({row_slot[a], int32_t(c), int32_t(std::min<int64_t>(chunk_rows, b - c)), 0});
            a = b;
        }
        chunks.clear();
        chunk_slots.clear();
        for (size_t p = 0; p < pieces.size(); ++p) {
            Piece &pc = pieces[p];
            const bool new_slot = p == 0 || pieces[p - 1].slot != pc.slot;
            const bool fresh = chunks.empty() || chunks.back().rows + pc.rows > chunk_rows ||
                               (new_slot && chunks.back().nslots == chunk_experts);
            if (fresh) {
                Chunk c;
                c.piece0 = int32_t(p);
                c.row0 = pc.row0;
                c.slot0 = int32_t(chunk_slots.size());
                chunks.push_back(c);
            }
            Chunk &c = chunks.back();
            if (fresh || new_slot) {
                chunk_slots.push_back(pc.slot);
                c.nslots++;
            }
            pc.dq = c.nslots - 1;
            c.rows += pc.rows;
            c.pieces++;
        }
    }
};

}  // namespace ft::cuda::prefill
