#pragma once
// Open-addressing hash map from node id (>= 0) to local id, for one batch of a
// sampler: global -> local ids across every hop, and a membership set for
// large fanouts. Linear probing over a power-of-two table; far fewer
// allocations and cache misses than std::unordered_map.

#include <cstdint>
#include <vector>

namespace torch_direct::sampler {

class FlatHashMap {
 public:
  explicit FlatHashMap(int64_t expected = 64) { reset(expected); }

  void reset(int64_t expected) {
    uint64_t cap = 16;
    while (cap < static_cast<uint64_t>(expected) * 2) {
      cap <<= 1;
    }
    set_capacity(cap);
    size_ = 0;
  }

  int64_t size() const { return size_; }

  // The value stored for `key`, inserting `value` first if the key is new.
  // `inserted` tells which happened.
  int64_t find_or_insert(int64_t key, int64_t value, bool& inserted) {
    if (static_cast<uint64_t>(size_ + 1) * 2 > keys_.size()) {
      grow();
    }
    uint64_t i = slot(key);
    while (true) {
      if (keys_[i] == key) {
        inserted = false;
        return values_[i];
      }
      if (keys_[i] == kEmpty) {
        keys_[i] = key;
        values_[i] = value;
        ++size_;
        inserted = true;
        return value;
      }
      i = (i + 1) & mask_;
    }
  }

  bool contains(int64_t key) const {
    uint64_t i = slot(key);
    while (keys_[i] != kEmpty) {
      if (keys_[i] == key) {
        return true;
      }
      i = (i + 1) & mask_;
    }
    return false;
  }

 private:
  static constexpr int64_t kEmpty = -1;

  // Fibonacci hashing: the high bits of the product are well mixed.
  uint64_t slot(int64_t key) const {
    return (static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ULL) >> shift_;
  }

  void set_capacity(uint64_t cap) {
    keys_.assign(cap, kEmpty);
    values_.resize(cap);
    mask_ = cap - 1;
    shift_ = 64;
    for (uint64_t c = cap; c > 1; c >>= 1) {
      --shift_;
    }
  }

  void grow() {
    std::vector<int64_t> old_keys = std::move(keys_);
    std::vector<int64_t> old_values = std::move(values_);
    set_capacity(old_keys.size() * 2);
    for (size_t j = 0; j < old_keys.size(); ++j) {
      if (old_keys[j] != kEmpty) {
        uint64_t i = slot(old_keys[j]);
        while (keys_[i] != kEmpty) {
          i = (i + 1) & mask_;
        }
        keys_[i] = old_keys[j];
        values_[i] = old_values[j];
      }
    }
  }

  std::vector<int64_t> keys_;
  std::vector<int64_t> values_;
  uint64_t mask_ = 0;
  int shift_ = 64;
  int64_t size_ = 0;
};

} // namespace torch_direct::sampler
