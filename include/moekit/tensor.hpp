// A non-owning view of a dense tensor on the host or a device.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "moekit/types.hpp"

namespace moekit {

enum class Device : int { kHost = 0, kCuda = 1 };

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // row-major, contiguous
  Device device = Device::kHost;
  int device_index = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

inline TensorView host_view(void* p, DType t, std::vector<int64_t> shape) {
  return TensorView{p, t, std::move(shape), Device::kHost, 0};
}
inline TensorView cuda_view(void* p, DType t, std::vector<int64_t> shape, int index = 0) {
  return TensorView{p, t, std::move(shape), Device::kCuda, index};
}

}  // namespace moekit
