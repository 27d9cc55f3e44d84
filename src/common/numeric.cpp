// Out-of-line forms of the storage-type conversions; the math lives once, in numeric.hpp.
#include "common/numeric.hpp"

namespace moekit::numeric {

float fp16_to_float(uint16_t h) { return fp16_to_float_hd(h); }
uint16_t float_to_fp16(float f) { return float_to_fp16_hd(f); }
float e4m3_to_float(uint8_t v) { return e4m3_to_float_hd(v); }
uint8_t float_to_e4m3(float f) { return float_to_e4m3_hd(f); }
float e2m1_to_float(uint8_t nibble) { return e2m1_to_float_hd(nibble); }
uint8_t float_to_e2m1(float f) { return float_to_e2m1_hd(f); }
float e8m0_to_float(uint8_t v) { return e8m0_to_float_hd(v); }
uint8_t float_to_e8m0_ceil(float f) { return float_to_e8m0_ceil_hd(f); }

}  // namespace moekit::numeric
