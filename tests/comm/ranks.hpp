// Runs one function per rank of a host world, each on its own thread, and collects what each
// rank threw (an Error's code, or kOk).
#pragma once
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "moekit/comm.hpp"

namespace moekit::test {

inline std::vector<ErrorCode> run_ranks(
    std::vector<std::unique_ptr<comm::Communicator>>& world,
    const std::function<void(int rank, comm::Communicator& comm)>& body) {
  std::vector<ErrorCode> codes(world.size(), ErrorCode::kOk);
  std::vector<std::thread> threads;
  for (size_t r = 0; r < world.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        body(static_cast<int>(r), *world[r]);
      } catch (const Error& e) {
        codes[r] = e.code();
      } catch (...) {
        codes[r] = ErrorCode::kInternal;
      }
    });
  }
  for (auto& t : threads) t.join();
  return codes;
}

}  // namespace moekit::test
