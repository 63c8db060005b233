// Launch planning for multi-tensor kernels: which tensor chunks go to which launch and block.
// A pure host function, so its invariants are unit-tested on machines without a GPU.
#pragma once

#include <cstdint>
#include <vector>

#include <c10/util/ArrayRef.h>

namespace amp::kernels {

/// Limits one launch must respect (the kernel's metadata arrays are sized by them).
struct LaunchLimits {
  /// Elements one block processes at most; a multiple of 8 keeps 16-byte vectors aligned.
  int64_t chunk_elems;
  /// Tensors whose metadata fits in one launch.
  int64_t max_tensors;
  /// Blocks whose metadata fits in one launch.
  int64_t max_blocks;
};

/// One block's work: chunk `chunk` (elements [chunk * chunk_elems, min(numel, ...))) of the
/// launch's tensor `slot`.
struct PlannedBlock {
  int32_t slot;
  int64_t chunk;
};

/// One launch: the tensors it sees (indices into the planned list) and its blocks.
struct PlannedLaunch {
  std::vector<int64_t> tensors;
  std::vector<PlannedBlock> blocks;
};

/// Packs tensors of the given sizes into as few launches as the limits allow, in list order;
/// empty tensors get no block. A tensor split across launches appears in each of them.
/// Errors: c10::Error when a limit is not positive or chunk_elems is not a multiple of 8.
std::vector<PlannedLaunch> plan_launches(c10::ArrayRef<int64_t> numels, const LaunchLimits& limits);

}  // namespace amp::kernels
