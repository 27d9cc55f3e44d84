// The device layout of kInt4Group / kInt8Group weights (include/moekit/types.hpp) that the sm90
// int engine builds once at load, one expert at a time, and uploads: what gemm/int_grouped_gemm.hpp
// reads. No dequantized copy of the weights exists anywhere; the kernels convert in registers.
//
// Per expert, for its [rows, cols] matrix with groups of `g` columns (cols / g groups per row):
//  - values [rows, cols * bits / 8]: each row K-major and packed as the checkpoint packs it
//    (int4: element 2j in the low nibble, which is also CUTLASS's int4b_t order, so the
//    mixed-input kernel's TMA loads the rows as they are), holding SIGNED codes q': without
//    zero points the checkpoint's own bytes; with zero points each unsigned code q re-centred
//    to q' = q - 8 (int4: nibble ^ 0x8) or q - 128 (int8: byte ^ 0x80), so one signed kernel
//    runs both kinds.
//  - scales fp32 [cols / g, rows]: the group scales transposed, MN-major, the layout CUTLASS's
//    mixed-input mainloop loads with TMA once per k tile (its StrideScale is (1, rows)).
//  - zero_terms fp32 [cols / g, rows], with zero points only: -(z - mid) * s (mid 8 or 128), so
//    that q' * s + zero_term is (q - z) * s up to the fp32 rounding of the two products.
// Rows are taken in `row_order` when given (engine row r is checkpoint row row_order[r]: FC1's
// blocked gate/up order, activation/gate_up_order.hpp); scales and zero points follow their rows.
// Host C++17 (CUDA translation units include it).
#pragma once
#include <cstdint>
#include <vector>

#include "moekit/weights.hpp"

namespace moekit::pipeline {

// Bits of one stored code: 4 for kInt4Group, 8 for kInt8Group; throws Error(kUnsupported)
// naming any other format.
int int_group_bits(WeightFormat f);

// Bytes of one expert's values in the device layout (the checkpoint's: rows * cols * bits / 8).
int64_t int_expert_value_bytes(const QuantizedTensor& t);
// fp32 entries of one expert's scales (and zero terms): rows * cols / group.
int64_t int_expert_group_entries(const QuantizedTensor& t);

// Writes expert e of `t` in the device layout: `values` int_expert_value_bytes(t) bytes,
// `scales` int_expert_group_entries(t) floats, `zero_terms` as many (or null: then t must have
// no zero points). row_order: t.rows entries naming checkpoint rows, or null for the identity.
// Throws Error(kInvalidArgument) naming the value for a bad expert, row index, buffer size or
// missing buffer, kUnsupported for a format other than the two int ones.
void int_expert_layout(const QuantizedTensor& t, int64_t e, const std::vector<int64_t>* row_order,
                       uint8_t* values, float* scales, float* zero_terms);

}  // namespace moekit::pipeline
