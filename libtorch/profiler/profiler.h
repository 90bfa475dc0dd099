#pragma once
/// `ckplan profile`: runs real forward and backward passes of a TorchScript
/// model with LibTorch and measures, op by op, what is kept for backward and
/// what it costs. Torch-free header: the Profile value is the planner's.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "planner/contracts/input_spec.h"
#include "planner/contracts/profile.h"

namespace ckplan {

struct ProfileOptions {
  std::string model_path;
  std::vector<InputSpec> inputs;
  int reps = 3;             ///< measured repetitions after one warm-up; times are medians
  int threads = 1;          ///< at::set_num_threads
  std::string device = "cpu";  ///< cpu, cuda[:N], or meta (shapes only: no data, no time)
  std::string dtype;            ///< --dtype: bf16, fp16, fp32 (parameters and float inputs); empty: as saved
  /// --autocast: bf16, fp16 or off: the forward and the loss under
  /// torch.autocast with that dtype on the profile's device; empty: as the
  /// archive was exported (ckplan_torch.export(autocast=...)), else none.
  std::string autocast;
  /// --calibrate: which targets' recomputation is timed as it runs
  /// (MeasureCalibration): `all`, `pytorch` (the wrapped modules' only: the
  /// pytorch and sac targets; the schedule target's stage runs priced at the
  /// ops' forward without autograd) or `none`.
  std::string calibrate = "all";
  uint64_t seed = 0;        ///< for the inputs
  /// Called with (done, total) steps; may be empty.
  std::function<void(int, int)> progress;
};

/// Profiles the model. Throws BadInput naming the file, or the op and module
/// that rejected the inputs. Warnings (a model in eval mode) are appended to
/// `warnings`.
Profile ProfileModel(const ProfileOptions& options, std::vector<std::string>* warnings);

}  // namespace ckplan
