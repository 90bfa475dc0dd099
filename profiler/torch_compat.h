#pragma once
// The few LibTorch API differences between 1.13 (Debian) and 2.x, in one place.

#include <torch/version.h>

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define CKPLAN_ALLOCATOR_CONST
#define CKPLAN_ALLOCATOR_HAS_COPY_DATA 1
#else
#define CKPLAN_ALLOCATOR_CONST const
#define CKPLAN_ALLOCATOR_HAS_COPY_DATA 0
#endif
