#pragma once
// Random numbers for the samplers: a small seedable generator per batch and
// unbiased bounded integers. Sampling code never uses `rand() % n` (modulo
// bias) or a shared global generator (contention, no determinism).

#include <cstdint>

#if defined(__CUDACC__)
#define TD_HOST_DEVICE __host__ __device__
#else
#define TD_HOST_DEVICE
#endif

namespace torch_direct::sampler {

// SplitMix64: spreads a user seed (and a batch number) into well-mixed state words.
TD_HOST_DEVICE inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// One stream per (seed, stream) pair; xoshiro256** (Blackman and Vigna).
class Rng {
 public:
  TD_HOST_DEVICE Rng(uint64_t seed, uint64_t stream) {
    uint64_t sm = seed ^ (stream * 0xD1B54A32D192ED03ULL);
    for (auto& w : s_) {
      w = splitmix64(sm);
    }
  }

  TD_HOST_DEVICE uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform integer in [0, bound), bound > 0, exactly unbiased: Lemire's
  // multiply-shift with rejection of the few low products that would
  // over-represent some values ("Fast Random Integer Generation in an Interval").
  TD_HOST_DEVICE uint64_t below(uint64_t bound) {
    uint64_t high;
    uint64_t low = multiply(next(), bound, high);
    if (low < bound) {
      const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
      while (low < threshold) {
        low = multiply(next(), bound, high);
      }
    }
    return high;
  }

 private:
  // The 128-bit product x * y: returns the low word, stores the high one.
  TD_HOST_DEVICE static uint64_t multiply(uint64_t x, uint64_t y, uint64_t& high) {
#if defined(__CUDA_ARCH__)
    high = __umul64hi(x, y);
    return x * y;
#else
    const unsigned __int128 m = static_cast<unsigned __int128>(x) * y;
    high = static_cast<uint64_t>(m >> 64);
    return static_cast<uint64_t>(m);
#endif
  }

  TD_HOST_DEVICE static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

} // namespace torch_direct::sampler
