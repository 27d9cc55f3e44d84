// The device layout of kMXFP4 / kNVFP4 / kMXFP8 weights (include/moekit/types.hpp) that a sm90
// microscaling engine builds once at load, one expert at a time, and uploads: what
// gemm/mx_grouped_gemm.hpp reads. No dequantized copy of the weights exists anywhere; the
// kernels convert in registers.
//
// Per expert, for its [rows, cols] matrix:
//  - values [rows, cols * bits / 8] row-major, the checkpoint's bytes as they are (e2m1: element
//    2j in the low nibble; e4m3: one byte each). gpt-oss's `*_blocks` [E, rows, cols / 32, 16]
//    and ModelOpt's packed NVFP4 weight [E, rows, cols / 2] are this layout already.
//  - scales: the raw 8-bit scales (e8m0 for kMXFP4 / kMXFP8, e4m3 for kNVFP4) [rows, cols /
//    block] row-major, also as the checkpoint stores them (gpt-oss `*_scales`, ModelOpt
//    `weight_scale`). NVFP4's fp32 global scale stays one per expert (QuantizedTensor's
//    global_scale, uploaded as it is).
// Why no other order: the decode GEMV's lane reads one 16-byte chunk of a row (32 e2m1 values:
// one MXFP4 block, two NVFP4 blocks; 16 e4m3: half an MXFP8 block) and that chunk's scale
// byte(s); neighbouring lanes take neighbouring chunks, so with row-major scales a warp's scale
// loads are one contiguous run of bytes (transposed [cols / block, rows] scales, as the int
// layout keeps them for CUTLASS, would put them `rows` bytes apart). The repack is then only
// FC1's row order: rows are taken in `row_order` when given (engine row r is checkpoint row
// row_order[r]: the blocked gate/up order of activation/gate_up_order.hpp, which gpt-oss's
// interleaved gate/up rows are gathered into), and scales follow their rows.
// Host C++17 (CUDA translation units include it).
#pragma once
#include <cstdint>
#include <vector>

#include "moekit/status.hpp"
#include "moekit/weights.hpp"

namespace moekit::pipeline {

// Whether `f` is one of the three microscaling formats this layout takes.
bool is_mx_format(WeightFormat f);

// The kernels' alignment for one [rows, cols] projection in format `f` (`what` names it, e.g.
// "fc1" with rows 2 x I and cols H, "fc2" with rows H and cols I): ok, or kUnsupported naming
// the value: cols a multiple of 32 (a GEMV lane's 16-byte chunk holds 32 e2m1 / 16 e4m3 values
// and the MXFP blocks are 32 wide), rows a multiple of 8 (16-byte rows of D), and kUnsupported
// for a format other than the three.
Status mx_check_matrix(WeightFormat f, int64_t rows, int64_t cols, const char* what);

// Bytes of one expert's values (rows * cols * bits / 8) and of its scale bytes
// (rows * cols / block) in the device layout.
int64_t mx_expert_value_bytes(const QuantizedTensor& t);
int64_t mx_expert_scale_bytes(const QuantizedTensor& t);

// Writes expert e of `t` in the device layout: `values` mx_expert_value_bytes(t) bytes, `scales`
// mx_expert_scale_bytes(t) bytes. row_order: t.rows entries naming checkpoint rows, or null for
// the identity. Throws Error: kUnsupported for another format or a shape mx_check_matrix
// refuses; kInvalidArgument naming the value for a bad expert, row index or buffer size, and for
// an e8m0 scale 0xff (NaN in OCP MX; check_weights refuses it too), naming expert, row and
// block. (The kernels decode 0xff as NaN, as quant::dequantize_expert does, should one reach
// them another way.)
void mx_expert_layout(const QuantizedTensor& t, int64_t e, const std::vector<int64_t>* row_order,
                      uint8_t* values, uint8_t* scales);

}  // namespace moekit::pipeline
