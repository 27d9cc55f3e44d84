// The tuner's routing profiles (tune/routing_profile.hpp).
#include "tune/routing_profile.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <random>
#include <sstream>

#include "moekit/status.hpp"

namespace moekit::tune {

std::string RoutingProfile::text() const {
  if (zipf_s == 0.0) return "uniform";
  std::ostringstream o;
  o << "zipf:" << zipf_s;
  return o.str();
}

RoutingProfile parse_routing_profile(const std::string& text) {
  RoutingProfile p;
  if (text == "uniform") return p;
  if (text == "zipf") {
    p.zipf_s = 1.0;
    return p;
  }
  if (text.rfind("zipf:", 0) == 0) {
    const std::string s = text.substr(5);
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size() && errno == 0 && std::isfinite(v) && v > 0) {
      p.zipf_s = v;
      return p;
    }
  }
  throw Error(ErrorCode::kInvalidArgument,
              "routing profile '" + text +
                  "' is not uniform, zipf or zipf:<s> with s a finite number above 0");
}

void draw_zipf_routing(const MoeSpec& spec, int64_t tokens, double zipf_s, uint64_t seed,
                       std::vector<float>* logits, std::vector<int32_t>* ids,
                       std::vector<float>* weights) {
  const int64_t E = spec.num_experts, k = spec.top_k;
  const bool external = spec.routing.method == RoutingMethod::kExternal;
  logits->assign(external ? 0 : static_cast<std::size_t>(tokens * E), 0.0f);
  ids->assign(external ? static_cast<std::size_t>(tokens * k) : 0, 0);
  weights->assign(external ? static_cast<std::size_t>(tokens * k) : 0,
                  1.0f / static_cast<float>(k));
  std::vector<double> log_p(static_cast<std::size_t>(E));
  for (int64_t e = 0; e < E; ++e) log_p[e] = -zipf_s * std::log(static_cast<double>(e + 1));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(1e-12, 1.0);
  // Gumbel-top-k: the k largest of log p + Gumbel noise are k draws without replacement.
  std::vector<double> keys(static_cast<std::size_t>(E));
  std::vector<int32_t> order(static_cast<std::size_t>(E));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t e = 0; e < E; ++e) keys[e] = log_p[e] - std::log(-std::log(u(rng)));
    if (!external) {
      for (int64_t e = 0; e < E; ++e) (*logits)[t * E + e] = static_cast<float>(keys[e]);
      continue;
    }
    for (int64_t e = 0; e < E; ++e) order[e] = static_cast<int32_t>(e);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return keys[a] > keys[b]; });
    std::copy(order.begin(), order.begin() + k, ids->begin() + t * k);
  }
}

}  // namespace moekit::tune
