// PyTorch's CPU allocator for a thinker's engine worker: large blocks kept for reuse, within a planned budget.
//
// The worker maps every large block on its own (glibc's mmap threshold pinned at 256 KiB,
// memory/measure.py), so that an encode adds only its live tensors to RssAnon and gives them back when it
// ends: the plan can size it. But each fresh mapping is paid page by page: an image through the 3B ViT
// faulted in ~3-4 GB of fresh pages, ~750k-1.1M page faults, as much system time as compute on a VM (its
// encode and the prompt after it took 1.9x as long as with glibc's heap). Here the blocks tensors free are
// kept by size and handed to the next tensor of that size (a transformer's layers allocate the same sizes
// over and over); a block is mapped when none of its size is free, after unmapping the largest cached
// blocks as far as needed for the cached bytes to stay within the larger of the live bytes' high-water
// mark (what mapping each block on its own reached) and ``budget`` (the plan's "block cache" item: the
// 1024-patch image above needs about its own live peak again to run without a fault after its first layer).
// release() gives everything cached back (after an encode, when the engine idles). Blocks under
// ``min_bytes`` go to the allocator this one replaces (glibc's heap).
#include <sys/mman.h>

#include <c10/core/CPUAllocator.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace edge_infer {
namespace {

constexpr size_t kPage = 4096;

class BlockCache final : public c10::Allocator {
 public:
  BlockCache(c10::Allocator* small, size_t min_bytes, size_t budget)
      : small_(small), min_bytes_(min_bytes), budget_(budget) {}

  c10::DataPtr allocate(size_t n) override {
    if (n < min_bytes_) return small_->allocate(n);
    const size_t size = (n + kPage - 1) / kPage * kPage;
    void* block = take(size);
    return {block, block, &give_back, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &give_back; }

  void copy_data(void* dest, const void* src, size_t count) const override { std::memcpy(dest, src, count); }

  // Unmaps every cached block; the bytes given back. The high-water mark restarts from the live bytes.
  int64_t release() {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t freed = cached_;
    while (!free_.empty()) unmap_largest();
    high_ = live_;
    return static_cast<int64_t>(freed);
  }

  std::vector<int64_t> stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {static_cast<int64_t>(live_), static_cast<int64_t>(cached_), static_cast<int64_t>(high_),
            static_cast<int64_t>(reused_), static_cast<int64_t>(mapped_)};
  }

  static BlockCache* installed;

 private:
  void* take(size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    live_ += size;
    high_ = std::max(high_, live_);
    auto hit = free_.find(size);
    if (hit != free_.end()) {
      void* block = hit->second;
      free_.erase(hit);
      cached_ -= size;
      ++reused_;
      return block;
    }
    while (!free_.empty() && cached_ > std::max(high_ - live_, budget_)) unmap_largest();
    void* block = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED) {
      live_ -= size;
      TORCH_CHECK(false, "edge_infer: out of memory mapping a block of ", size, " bytes");
    }
    sizes_[block] = size;
    ++mapped_;
    return block;
  }

  // Every block's deleter, raw_deleter() too: raw_allocate() hands out small blocks with it as well.
  static void give_back(void* block) {
    BlockCache* self = installed;
    std::unique_lock<std::mutex> lock(self->mutex_);
    const auto known = self->sizes_.find(block);
    if (known == self->sizes_.end()) {
      lock.unlock();
      return self->small_->raw_deleter()(block);
    }
    const size_t size = known->second;
    self->live_ -= size;
    self->cached_ += size;
    self->free_.emplace(size, block);
  }

  void unmap_largest() {  // under the lock, free_ not empty
    auto largest = std::prev(free_.end());
    munmap(largest->second, largest->first);
    cached_ -= largest->first;
    sizes_.erase(largest->second);
    free_.erase(largest);
  }

  c10::Allocator* small_;
  const size_t min_bytes_, budget_;
  std::mutex mutex_;
  std::multimap<size_t, void*> free_;         // cached blocks by size
  std::unordered_map<void*, size_t> sizes_;   // every block mapped here, live or cached
  // Bytes. Each allocation leaves live_ + cached_ <= max(high_, live_ + budget_); a free moves a block from
  // live_ to cached_, leaving the sum (the resident bytes) as it was.
  size_t live_ = 0, cached_ = 0, high_ = 0;
  size_t reused_ = 0, mapped_ = 0;            // blocks handed out again / mapped
};

BlockCache* BlockCache::installed = nullptr;

// Installs the cache as PyTorch's CPU allocator for the rest of the process (once; later calls keep the
// first settings). Blocks allocated before keep their own allocator's deleter.
bool cache_large_blocks(int64_t min_bytes, int64_t budget) {
  static std::once_flag once;
  std::call_once(once, [min_bytes, budget] {
    BlockCache::installed =
        new BlockCache(c10::GetCPUAllocator(), static_cast<size_t>(min_bytes), static_cast<size_t>(budget));
    c10::SetCPUAllocator(BlockCache::installed, /*priority=*/1);
  });
  return true;
}

int64_t release_cached_blocks() { return BlockCache::installed ? BlockCache::installed->release() : 0; }

// [live, cached, high-water, blocks reused, blocks mapped] (all 0 before cache_large_blocks).
std::vector<int64_t> block_cache_stats() {
  return BlockCache::installed ? BlockCache::installed->stats() : std::vector<int64_t>(5, 0);
}

}  // namespace
}  // namespace edge_infer

TORCH_LIBRARY_FRAGMENT(edge_infer, lib) {
  lib.def("cache_large_blocks(int min_bytes, int budget) -> bool", &edge_infer::cache_large_blocks);
  lib.def("release_cached_blocks() -> int", &edge_infer::release_cached_blocks);
  lib.def("block_cache_stats() -> int[]", &edge_infer::block_cache_stats);
}
