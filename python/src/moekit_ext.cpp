// moekit._moekit: the library's C++ API for Python (nanobind). The Python package python/moekit
// wraps it; tensors cross as DLPack (any producer: numpy, torch, cupy, jax) without a copy in the
// forward, and moekit::Error becomes a moekit.Error subclass carrying the ErrorCode.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/packing.hpp"
#include "io/safetensors.hpp"
#include "moekit/environment.hpp"
#include "moekit/io.hpp"
#include "moekit/layer.hpp"
#include "moekit/presets.hpp"
#include "moekit/registry.hpp"
#include "moekit/spec.hpp"
#include "moekit/status.hpp"
#include "moekit/version.hpp"
#include "moekit/weights.hpp"
#include "quant/quant.hpp"

namespace nb = nanobind;

namespace moekit::python {
namespace {

using io::StDtype;
using ReadArray = nb::ndarray<nb::ro>;  // any tensor, read-only access is enough
using WriteArray = nb::ndarray<>;       // a tensor the forward writes

[[noreturn]] void invalid(const std::string& sentence) {
  throw Error(ErrorCode::kInvalidArgument, sentence);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- DLPack dtypes
// -------------------------------------------------------------------------------

using Code = nb::dlpack::dtype_code;

// Each safetensors dtype (the full set moekit's files use) and its DLPack dtype, one lane.
struct DtypePair {
  StDtype st;
  Code code;
  uint8_t bits;
};
constexpr DtypePair kDtypes[] = {
    {StDtype::kBool, Code::Bool, 8},
    {StDtype::kU8, Code::UInt, 8},
    {StDtype::kI8, Code::Int, 8},
    {StDtype::kF8E5M2, Code::Float8_E5M2, 8},
    {StDtype::kF8E4M3, Code::Float8_E4M3FN, 8},
    {StDtype::kF8E8M0, Code::Float8_E8M0FNU, 8},
    {StDtype::kI16, Code::Int, 16},
    {StDtype::kU16, Code::UInt, 16},
    {StDtype::kF16, Code::Float, 16},
    {StDtype::kBF16, Code::Bfloat, 16},
    {StDtype::kI32, Code::Int, 32},
    {StDtype::kU32, Code::UInt, 32},
    {StDtype::kF32, Code::Float, 32},
    {StDtype::kF64, Code::Float, 64},
    {StDtype::kI64, Code::Int, 64},
    {StDtype::kU64, Code::UInt, 64},
};

std::optional<StDtype> st_dtype_of(nb::dlpack::dtype t) {
  for (const DtypePair& p : kDtypes)
    if (t.lanes == 1 && t.code == uint8_t(p.code) && t.bits == p.bits) return p.st;
  return std::nullopt;
}

nb::dlpack::dtype dlpack_of(StDtype t) {
  for (const DtypePair& p : kDtypes)
    if (p.st == t) return nb::dlpack::dtype{uint8_t(p.code), p.bits, 1};
  throw Error(ErrorCode::kInternal, std::string("no DLPack dtype for ") + io::st_dtype_name(t));
}

std::string dlpack_dtype_text(nb::dlpack::dtype t) {
  if (auto s = st_dtype_of(t)) return io::st_dtype_name(*s);
  return "DLPack dtype (code " + std::to_string(t.code) + ", " + std::to_string(t.bits) +
         " bits, " + std::to_string(t.lanes) + " lanes)";
}

// ---- Tensors in --------------------------------------------------------------------------------

template <class Array>
std::vector<int64_t> shape_of(const Array& a) {
  std::vector<int64_t> s(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) s[i] = a.shape(i);
  return s;
}

// Row-major and dense (a dimension of extent 1 may have any stride, and so may any dimension of
// an empty tensor), as TensorView requires.
template <class Array>
void require_contiguous(const Array& a, const std::string& name) {
  for (std::size_t i = 0; i < a.ndim(); ++i)
    if (a.shape(i) == 0) return;
  int64_t expected = 1;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expected)
      invalid(name + " is not contiguous (shape " + shape_text(shape_of(a)) + ", stride " +
              std::to_string(a.stride(i)) + " in dimension " + std::to_string(i) + ", expected " +
              std::to_string(expected) +
              "); pass a contiguous tensor (.contiguous(), "
              "numpy.ascontiguousarray).");
    expected *= a.shape(i);
  }
}

// `obj` as a DLPack tensor without any conversion or copy; Error naming `name` otherwise.
ReadArray read_array(nb::handle obj, const std::string& name) {
  ReadArray a;
  if (!nb::try_cast<ReadArray>(obj, a, /*convert=*/false))
    invalid(name + " is a " + nb::inst_name(obj).c_str() +
            ", not a tensor (any DLPack producer: numpy, torch, cupy, jax).");
  return a;
}

WriteArray write_array(nb::handle obj, const std::string& name) {
  WriteArray a;
  if (!nb::try_cast<WriteArray>(obj, a, /*convert=*/false)) {
    read_array(obj, name);  // not a tensor at all: that error
    invalid(name + " is read-only; the forward writes it.");
  }
  return a;
}

// A view of `a` (host or CUDA memory, dtype one of moekit's, contiguous): no copy.
template <class Array>
TensorView view_of(const Array& a, const std::string& name) {
  const auto st = st_dtype_of(a.dtype());
  const std::optional<DType> dt = st ? io::to_dtype(*st) : std::nullopt;
  if (!dt)
    invalid(name + " has dtype " + dlpack_dtype_text(a.dtype()) +
            ", which moekit has no type for (float32, bfloat16, float16, float8_e4m3fn, uint8, "
            "int8, int32, int64).");
  require_contiguous(a, name);
  TensorView v;
  v.data = const_cast<void*>(a.data());
  v.dtype = *dt;
  v.shape = shape_of(a);
  const int dev = a.device_type();
  if (dev == nb::device::cpu::value) {
    v.device = Device::kHost;
  } else if (dev == nb::device::cuda::value) {
    v.device = Device::kCuda;
    v.device_index = a.device_id();
  } else {
    invalid(name + " lives on DLPack device type " + std::to_string(dev) +
            "; moekit reads host (CPU) or CUDA device memory.");
  }
  return v;
}

// Whether two views share a byte of the same memory.
bool overlap(const TensorView& a, const TensorView& b) {
  if (!a.data || !b.data || a.numel() == 0 || b.numel() == 0) return false;
  if (a.device != b.device || (a.device == Device::kCuda && a.device_index != b.device_index))
    return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

TensorView optional_view(nb::handle obj, const std::string& name, std::optional<ReadArray>& keep) {
  if (obj.is_none()) return {};
  keep = read_array(obj, name);
  return view_of(*keep, name);
}

// ---- Spec --------------------------------------------------------------------------------------

// The spec object Python holds; all field handling is spec_to_json / spec_from_json.
struct Spec {
  MoeSpec spec;
};

Spec spec_from_text(const std::string& text) { return Spec{spec_from_json(text)}; }

// ---- Weights -----------------------------------------------------------------------------------

// One layer's weights as the layer reads them (the local shard for a sharded spec), and the spec
// they were made for.
struct Weights {
  std::shared_ptr<const MoeWeights> weights;
  MoeSpec spec;
};

// A tensor the weights dict must hold: its key, the dtypes accepted, its shape and where its bytes
// go.
struct Expected {
  std::string key;
  std::vector<StDtype> dtypes;
  std::vector<int64_t> shape;
  void* dst;
  std::size_t bytes;
};

// The keys, dtypes and shapes of the weights dict are those of the `moekit` model family's files
// (ExpertStorage::kNative: the QuantizedTensor buffers as they are in memory) without the
// "layers.{L}.experts." prefix, for the FULL (unsharded) layer.
std::vector<Expected> expected_tensors(const MoeSpec& spec, MoeWeights& w) {
  const io::Packing pk = io::packing_of(spec.weights);
  const int64_t E = spec.num_experts, H = spec.hidden, I = spec.intermediate;
  const int64_t R = spec.fc1_rows();
  w.fc1 = io::alloc_tensor(spec.weights, E, R, H);
  w.fc2 = io::alloc_tensor(spec.weights, E, H, I);
  std::vector<Expected> want;
  auto bytes_of = [](auto& v) { return v.size() * sizeof(v[0]); };
  auto one_byte = [](std::vector<StDtype> d) {  // raw bytes of any 8-bit type may come as uint8
    if (io::st_dtype_size(d.front()) == 1 && d.front() != StDtype::kU8) d.push_back(StDtype::kU8);
    return d;
  };
  auto projection = [&](const std::string& p, QuantizedTensor& t, int64_t rows, int64_t cols) {
    want.push_back({p + ".values",
                    one_byte({io::value_dtype(spec.weights)}),
                    {E, rows, pk.value_cols(cols)},
                    t.values.data(),
                    bytes_of(t.values)});
    const std::vector<int64_t> ss = {E, pk.scale_rows(rows), pk.scale_cols(cols)};
    if (pk.scale_size == 4)
      want.push_back({p + ".scales", {StDtype::kF32}, ss, t.scales.data(), bytes_of(t.scales)});
    if (pk.scale_size == 1)
      want.push_back({p + ".scales", one_byte(io::scale_dtypes_read(t.format)), ss,
                      t.scale_bytes.data(), bytes_of(t.scale_bytes)});
    if (pk.zeros)
      want.push_back({p + ".zeros",
                      {StDtype::kU8},
                      {E, rows, pk.scale_cols(cols)},
                      t.zeros.data(),
                      bytes_of(t.zeros)});
    auto scalars = [&](const char* suffix, std::vector<float>& v) {
      want.push_back({p + suffix, {StDtype::kF32}, {E}, v.data(), bytes_of(v)});
    };
    if (pk.weight_scale) scalars(".weight_scale", t.weight_scale);
    if (pk.global_scale) scalars(".global_scale", t.global_scale);
    if (pk.input_scale) scalars(".input_scale", t.input_scale);
    if (pk.pre_quant)
      want.push_back({p + ".pre_quant_scale",
                      {StDtype::kF32},
                      {E, cols},
                      t.pre_quant_scale.data(),
                      bytes_of(t.pre_quant_scale)});
  };
  projection("fc1", w.fc1, R, H);
  projection("fc2", w.fc2, H, I);
  auto dense = [&](const char* key, std::vector<float>& v, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    v.resize(static_cast<std::size_t>(n));
    want.push_back({key, {StDtype::kF32}, std::move(shape), v.data(), bytes_of(v)});
  };
  if (spec.fc1_bias) dense("fc1_bias", w.fc1_bias, {E, R});
  if (spec.fc2_bias) dense("fc2_bias", w.fc2_bias, {E, H});
  if (spec.routing.correction_bias) dense("routing_bias", w.routing_bias, {E});
  return want;
}

std::string key_list(const std::vector<Expected>& want) {
  std::string s;
  for (const Expected& e : want) s += (s.empty() ? "" : ", ") + e.key;
  return s;
}

MoeSpec unsharded(MoeSpec s) {
  s.tp_size = s.ep_size = 1;
  s.tp_rank = s.ep_rank = 0;
  return s;
}

// Copies a dict of host tensors (the full layer) into MoeWeights, checks them and cuts the
// spec's shard.
Weights weights_from_tensors(const Spec& spec, const nb::dict& tensors) {
  spec.spec.validate_or_throw();
  const MoeSpec full = unsharded(spec.spec);
  MoeWeights w;
  const std::vector<Expected> want = expected_tensors(full, w);
  for (auto [k, v] : tensors) {
    const std::string key = nb::str(k).c_str();
    bool known = false;
    for (const Expected& e : want) known = known || e.key == key;
    if (!known)
      invalid("weights has a tensor '" + key + "' that a " + to_string(full.weights.format) +
              " layer with this spec does not read; it reads " + key_list(want) + ".");
  }
  for (const Expected& e : want) {
    const std::string name = "weights['" + e.key + "']";
    if (!tensors.contains(e.key.c_str()))
      invalid("weights lacks '" + e.key + "' (" + io::st_dtype_name(e.dtypes.front()) + " " +
              shape_text(e.shape) + "); a " + to_string(full.weights.format) +
              " layer with this spec reads " + key_list(want) + ".");
    const ReadArray a = read_array(tensors[e.key.c_str()], name);
    if (a.device_type() != nb::device::cpu::value)
      invalid(name + " is not in host memory; weights are read from the host (torch: .cpu()).");
    const auto st = st_dtype_of(a.dtype());
    bool dtype_ok = false;
    std::string accepted;
    for (StDtype d : e.dtypes) {
      dtype_ok = dtype_ok || (st && *st == d);
      accepted += (accepted.empty() ? "" : " or ") + std::string(io::st_dtype_name(d));
    }
    if (!dtype_ok)
      invalid(name + " has dtype " + dlpack_dtype_text(a.dtype()) + ", expected " + accepted + ".");
    if (shape_of(a) != e.shape)
      invalid(name + " has shape " + shape_text(shape_of(a)) + ", expected " + shape_text(e.shape) +
              ".");
    require_contiguous(a, name);
    if (a.nbytes() != e.bytes)
      throw Error(ErrorCode::kInternal, name + " holds " + std::to_string(a.nbytes()) +
                                            " bytes where its buffer has " +
                                            std::to_string(e.bytes) + ".");
    if (e.bytes) std::memcpy(e.dst, a.data(), e.bytes);
  }
  check_weights(full, w);
  const bool sharded = spec.spec.tp_size > 1 || spec.spec.ep_size > 1;
  return Weights{
      std::make_shared<const MoeWeights>(sharded ? shard_weights(spec.spec, w) : std::move(w)),
      spec.spec};
}

// ---- Tensors out -------------------------------------------------------------------------------

// An owning host array of `t`'s bytes (a DLPack producer: numpy.from_dlpack, torch.from_dlpack).
nb::object array_of(NamedTensor t) {
  auto* owned = new NamedTensor(std::move(t));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<NamedTensor*>(p); });
  std::vector<std::size_t> shape(owned->shape.begin(), owned->shape.end());
  nb::ndarray<nb::array_api> a(owned->bytes.data(), shape.size(), shape.data(), owner, nullptr,
                               dlpack_of(io::from_dtype(owned->dtype)), nb::device::cpu::value, 0);
  return a.cast();
}

// Keys are the tensors' names less the first of `prefixes` each starts with.
nb::dict tensors_dict(std::vector<NamedTensor> tensors, const std::vector<std::string>& prefixes) {
  nb::dict d;
  for (NamedTensor& t : tensors) {
    std::string key = t.name;
    for (const std::string& p : prefixes)
      if (key.rfind(p, 0) == 0) {
        key = key.substr(p.size());
        break;
      }
    d[key.c_str()] = array_of(std::move(t));
  }
  return d;
}

// ---- Layer -------------------------------------------------------------------------------------

class Layer {
 public:
  Layer(const Spec& spec, const Weights& weights, const std::string& backend, int device_index) {
    LayerOptions o;
    o.backend = backend;
    o.device_index = device_index;
    nb::gil_scoped_release unlocked;
    layer_ = MoeLayer::create(spec.spec, *weights.weights, o);
  }

  // Views over the callers' tensors, then the forward on `stream` (a cudaStream_t; 0 is the
  // default stream). Nothing is copied; the shape, dtype and device checks are MoeLayer's.
  void forward(nb::handle hidden, nb::handle router_logits, nb::handle topk_ids,
               nb::handle topk_weights, nb::handle output, uintptr_t stream) {
    ForwardArgs args;
    const ReadArray h = read_array(hidden, "hidden");
    args.hidden = view_of(h, "hidden");
    const WriteArray out = write_array(output, "output");
    args.output = view_of(out, "output");
    std::optional<ReadArray> logits, ids, weights;
    args.router_logits = optional_view(router_logits, "router_logits", logits);
    args.topk_ids = optional_view(topk_ids, "topk_ids", ids);
    args.topk_weights = optional_view(topk_weights, "topk_weights", weights);
    args.stream = reinterpret_cast<void*>(stream);
    // The engines read their inputs while they write the output: refuse a shared byte.
    const std::pair<const TensorView*, const char*> inputs[] = {
        {&args.hidden, "hidden"},
        {&args.router_logits, "router_logits"},
        {&args.topk_ids, "topk_ids"},
        {&args.topk_weights, "topk_weights"}};
    for (const auto& [in, name] : inputs)
      if (overlap(*in, args.output))
        invalid(std::string("output shares memory with ") + name +
                "; the forward needs a separate output tensor.");
    {
      nb::gil_scoped_release unlocked;
      layer_->forward(args);
    }
  }

  const MoeLayer& layer() const { return *layer_; }
  MoeLayer& layer() { return *layer_; }

 private:
  std::unique_ptr<MoeLayer> layer_;
};

// ---- Errors ------------------------------------------------------------------------------------

// moekit::Error -> moekit.<Class>(code name, message): the classes live in moekit/_errors.py.
void translate_errors(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    nb::object cls = nb::module_::import_("moekit._errors").attr("error_class")(int(e.code()));
    nb::object value = cls(e.what(), to_string(e.code()));
    PyErr_SetObject(cls.ptr(), value.ptr());
  }
}

nb::dict environment_dict() {
  const Environment& env = Environment::detected();
  nb::dict d;
  nb::list gpus;
  for (const GpuInfo& g : env.gpus) {
    nb::dict gd;
    gd["name"] = g.name;
    gd["sm"] = g.sm;
    gd["multiprocessors"] = g.multiprocessors;
    gd["memory_bytes"] = g.memory_bytes;
    gpus.append(gd);
  }
  d["gpus"] = gpus;
  d["built_with_cuda"] = env.built_with_cuda;
  d["built_with_cutlass"] = env.built_with_cutlass;
  d["cuda_runtime_version"] = env.cuda_runtime_version;
  d["cuda_driver_version"] = env.cuda_driver_version;
  d["library_version"] = env.library_version;
  d["probe_note"] = env.probe_note;
  d["fingerprint"] = env.fingerprint();
  return d;
}

}  // namespace
}  // namespace moekit::python

NB_MODULE(_moekit, m) {
  using namespace moekit;
  using namespace moekit::python;
  m.doc() = "moekit's C++ library; use the moekit package, which wraps this module.";
  nb::register_exception_translator(translate_errors);
  m.def(
      "version", [] { return std::string(version()); }, "The linked library's version.");

  nb::class_<Spec>(m, "NativeSpec", "A validated-on-demand MoeSpec; fields through JSON.")
      .def_static("from_json", &spec_from_text, nb::arg("text"),
                  "spec_from_json: every field, enums by name; unknown keys are refused.")
      .def("to_json", [](const Spec& s) { return spec_to_json(s.spec); })
      .def(
          "violations", [](const Spec& s) { return s.spec.validate(); },
          "Every violation, one sentence each (empty: valid).")
      .def("validate", [](const Spec& s) { s.spec.validate_or_throw(); })
      .def("fc1_rows", [](const Spec& s) { return s.spec.fc1_rows(); })
      .def("local_problem", [](const Spec& s) {
        const LocalProblem lp = derive_local(s.spec);
        nb::dict d;
        d["num_experts_global"] = lp.num_experts_global;
        d["num_experts"] = lp.num_experts;
        d["first_expert"] = lp.first_expert;
        d["top_k"] = lp.top_k;
        d["hidden"] = lp.hidden;
        d["intermediate"] = lp.intermediate;
        d["intermediate_offset"] = lp.intermediate_offset;
        d["fc1_rows"] = lp.fc1_rows;
        d["adds_fc2_bias"] = lp.adds_fc2_bias;
        return d;
      });

  m.def(
      "presets",
      [] {
        nb::list out;
        for (const Preset& p : list_presets())
          out.append(nb::make_tuple(p.name, p.description, p.family, spec_to_json(p.spec)));
        return out;
      },
      "(name, description, family, spec JSON) of each built-in preset, in order.");
  m.def(
      "preset",
      [](const std::string& name) {
        const Preset& p = find_preset(name);
        return nb::make_tuple(p.name, p.description, p.family, spec_to_json(p.spec));
      },
      nb::arg("name"));
  m.def(
      "resolve",
      [](const Spec& spec, const std::string& backend) {
        const Resolution r = resolve(spec.spec, Environment::detected(), backend);
        return resolution_json_with_spec(spec.spec, r);
      },
      nb::arg("spec"), nb::arg("backend") = "auto",
      "The resolution report as `moekit resolve --json` prints it.");
  m.def("environment", &environment_dict, "The machine and build, as the resolver sees them.");

  nb::class_<Weights>(m, "NativeWeights", "One layer's expert weights, on the host.")
      .def_static("from_tensors", &weights_from_tensors, nb::arg("spec"), nb::arg("tensors"))
      .def_static(
          "random",
          [](const Spec& spec, uint64_t seed) {
            spec.spec.validate_or_throw();
            nb::gil_scoped_release unlocked;
            return Weights{
                std::make_shared<const MoeWeights>(quant::make_random_weights(spec.spec, seed)),
                spec.spec};
          },
          nb::arg("spec"), nb::arg("seed"))
      .def_static(
          "load",
          [](const std::vector<std::string>& paths, const std::string& family, int layer,
             const Spec& spec) {
            std::vector<std::string> files;
            for (const std::string& p : paths)
              for (std::string& f : checkpoint_files(p)) files.push_back(std::move(f));
            const ModelFamily& fam = find_model_family(family);
            nb::gil_scoped_release unlocked;
            return Weights{std::make_shared<const MoeWeights>(
                               load_layer_weights(files, fam, layer, spec.spec)),
                           spec.spec};
          },
          nb::arg("paths"), nb::arg("family"), nb::arg("layer"), nb::arg("spec"))
      .def("spec", [](const Weights& w) { return Spec{w.spec}; })
      .def(
          "save",
          [](const Weights& w, const std::string& path, const std::string& family, int layer) {
            save_layer_weights(path, find_model_family(family), layer, w.spec, *w.weights);
          },
          nb::arg("path"), nb::arg("family"), nb::arg("layer"))
      .def("tensors", [](const Weights& w) {
        return tensors_dict(
            layer_weight_tensors(find_model_family("moekit"), 0, w.spec, *w.weights),
            {"layers.0.experts.", "layers.0."});
      });

  m.def(
      "model_families",
      [] {
        nb::list out;
        for (const ModelFamily& f : model_families())
          out.append(nb::make_tuple(f.name, f.description));
        return out;
      },
      "(name, description) of each model family load_weights knows.");
  m.def("checkpoint_files", &checkpoint_files, nb::arg("path"));
  m.def(
      "load_tensors", [](const std::string& path) { return tensors_dict(read_tensors(path), {}); },
      nb::arg("path"), "Every tensor of a safetensors file, as host arrays (DLPack producers).");
  m.def(
      "save_tensors",
      [](const std::string& path, const nb::dict& tensors,
         const std::map<std::string, std::string>& metadata) {
        std::vector<NamedTensor> out;
        for (auto [k, v] : tensors) {
          const std::string key = nb::str(k).c_str();
          const ReadArray a = read_array(v, "tensors['" + key + "']");
          const TensorView view = view_of(a, "tensors['" + key + "']");
          if (view.device != Device::kHost)
            invalid("tensors['" + key + "'] is not in host memory (torch: .cpu()).");
          out.push_back(make_named_tensor(key, view.dtype, view.shape, view.data));
        }
        write_tensors(path, out, metadata);
      },
      nb::arg("path"), nb::arg("tensors"),
      nb::arg("metadata") = std::map<std::string, std::string>{});

  nb::class_<Layer>(m, "NativeLayer", "A resolved layer with its prepared weights.")
      .def(nb::init<const Spec&, const Weights&, const std::string&, int>(), nb::arg("spec"),
           nb::arg("weights"), nb::arg("backend") = "auto", nb::arg("device_index") = 0)
      .def("forward", &Layer::forward, nb::arg("hidden"), nb::arg("router_logits").none(),
           nb::arg("topk_ids").none(), nb::arg("topk_weights").none(), nb::arg("output"),
           nb::arg("stream") = 0)
      .def("implementation_id", [](const Layer& l) { return l.layer().implementation().id(); })
      .def("on_device",
           [](const Layer& l) { return l.layer().implementation().device() == Device::kCuda; })
      .def("spec", [](const Layer& l) { return Spec{l.layer().spec()}; })
      .def("resolution_json",
           [](const Layer& l) {
             return resolution_json_with_spec(l.layer().spec(), l.layer().resolution());
           })
      .def("workspace_bytes", [](const Layer& l) { return l.layer().workspace_bytes(); })
      .def("poll_errors", [](Layer& l) {
        Status s;
        {
          nb::gil_scoped_release unlocked;
          s = l.layer().poll_errors();
        }
        throw_if_error(s);
      });
}
