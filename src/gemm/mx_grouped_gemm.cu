// MxGroupedGemm (mx_grouped_gemm.hpp): its tactic list (the GEMV of sm90_mx_gemv.cu), the pick
// and the checks.
#include "gemm/mx_grouped_gemm.hpp"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "common/cuda_status.hpp"
#include "gemm/grouped_checks.hpp"
#include "gemm/mx_tactic.hpp"

namespace moekit::gemm {

struct MxGroupedGemm::State {
  MxGroupedShape shape;
  std::vector<std::string> names;
  std::vector<std::unique_ptr<mx_detail::MxTactic>> tactics;
};

Status MxGroupedGemm::validate(const MxGroupedShape& s) {
  const std::string what = "mx grouped GEMM";
  if (Status st = detail::check_grouped_extents(what, s.groups, s.n, s.k, s.max_rows, s.elem);
      !st.ok())
    return st;
  if (s.format != WeightFormat::kMXFP4 && s.format != WeightFormat::kNVFP4 &&
      s.format != WeightFormat::kMXFP8)
    return Status(ErrorCode::kUnsupported, what + " runs mxfp4, nvfp4 or mxfp8 weights, not " +
                                               std::string(to_string(s.format)));
  if (s.k % 32 != 0)
    return Status(ErrorCode::kUnsupported,
                  what + " k " + std::to_string(s.k) +
                      " must be a multiple of 32 (a 16-byte chunk of the GEMV holds 32 e2m1 or 16 "
                      "e4m3 values, and MXFP blocks are 32 wide)");
  return {};
}

MxGroupedGemm::MxGroupedGemm(const MxGroupedShape& shape, int device)
    : state_(std::make_unique<State>()) {
  throw_if_error(validate(shape));
  state_->shape = shape;
  DeviceGuard guard(device);
  const int sm_count = detail::require_sm90(device, "the mx grouped GEMM");
  std::vector<mx_detail::MxTacticEntry> entries = mx_detail::sm90_mx_gemv_tactics(shape);
  for (auto& e : mx_detail::sm90_mx_wgmma_tactics(shape)) entries.push_back(std::move(e));
  for (auto& e : entries) {
    std::unique_ptr<mx_detail::MxTactic> t = e.make();
    throw_if_error(t->init(shape, sm_count));
    state_->names.push_back(e.name);
    state_->tactics.push_back(std::move(t));
  }
  check_cuda(cudaDeviceSynchronize(), "finishing the mx grouped GEMM's set-up");
}

MxGroupedGemm::~MxGroupedGemm() = default;

std::vector<std::string> MxGroupedGemm::tactics() const { return state_->names; }

namespace {
// Rows per group up to which the GEMV is the pick (not yet measured against the tensor cores).
constexpr double kGemvRows = 8.0;
}  // namespace

std::string MxGroupedGemm::pick_tactic(double rows_per_group_hint) const {
  // The 2-row GEMV (where built) up to 2 rows: its registers leave room for two blocks per SM;
  // the 8-row one up to kGemvRows, which re-reads its weights once per 8 rows; the tensor-core
  // tactic (where built for the shape) above, 64 tokens per tile up to 64 rows.
  const auto find = [&](const char* want) -> std::string {
    for (const std::string& n : state_->names)
      if (n.find(want) != std::string::npos) return n;
    return {};
  };
  std::string pick;
  if (rows_per_group_hint > kGemvRows) {
    if (rows_per_group_hint <= 64.0) pick = find(".wgmma.n64");
    if (pick.empty()) pick = find(".wgmma.n128");
  }
  if (pick.empty()) pick = find(rows_per_group_hint <= 2.0 ? ".gemv.n2" : ".gemv.n8");
  return pick.empty() ? state_->names.front() : pick;
}

Status MxGroupedGemm::run(const Call& c, const int32_t* row_offsets, cudaStream_t stream) {
  const MxGroupedShape& s = state_->shape;
  const std::string tactic = c.tactic.empty() ? pick_tactic(c.rows_per_group_hint) : c.tactic;
  const auto it = std::find(state_->names.begin(), state_->names.end(), tactic);
  if (it == state_->names.end())
    return Status(ErrorCode::kNotFound, "mx grouped GEMM tactic \"" + tactic + "\" is not built");
  const bool nvfp4 = s.format == WeightFormat::kNVFP4;
  const Status st_operands = detail::check_operands(
      "mx grouped GEMM",
      {{c.a, "A"},
       {c.w, "the weights"},
       {c.scales, "the scales"},
       {c.d, "D"},
       {row_offsets, "row_offsets"},
       {nvfp4 ? static_cast<const void*>(c.global_scales) : row_offsets, "the global scales"},
       {s.bias ? static_cast<const void*>(c.bias) : row_offsets, "the bias"}},
      {c.a, c.w, c.d, c.scales});
  if (!st_operands.ok()) return st_operands;
  if (s.max_rows == 0) return {};
  mx_detail::MxProblem p;
  p.row_offsets = row_offsets;
  p.a = c.a;
  p.w = static_cast<const uint8_t*>(c.w);
  p.scales = c.scales;
  p.global_scales = nvfp4 ? c.global_scales : nullptr;
  p.bias = s.bias ? c.bias : nullptr;
  p.d = c.d;
  p.rows_bound = c.rows_bound;
  return state_->tactics[static_cast<std::size_t>(it - state_->names.begin())]->run(p, stream);
}

const MxGroupedShape& MxGroupedGemm::shape() const { return state_->shape; }

std::size_t MxGroupedGemm::workspace_bytes() const { return 0; }

}  // namespace moekit::gemm
