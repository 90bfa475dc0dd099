#pragma once
// Meta kernels LibTorch's C++ lacks, for the common ops (meta_kernels.cc).
// Part of the runtime (LibTorch).

namespace ckplan {

/// Registers them with the dispatcher (once: OpenMetaDevice calls it when
/// `--device meta` is first used).
void RegisterMetaKernels();

}  // namespace ckplan
