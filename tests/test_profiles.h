#pragma once
// Profiles for the planner tests, written as profile JSON with every value
// chosen by hand (torch-free: the LibTorch tests profile real models).

#include <cstdint>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ckplan::testing {

// Five ops in two blocks; block b has a skip connection (t2 is read by b's
// add), so it is one stage. Storage ids are the tensor ids.
//   t0 (x, 1000 B) -> a.fc -> t1 (2000, freed after use) -> a.act -> t2 (2000, kept by relu)
//   t2 -> b.fc -> t3 (800, freed) -> b.act -> t4 (800, kept by tanh)
//   b: add(t4, t2) -> t5 (800, the model output)
// A float32 tensor record of `bytes`, made by op `producer` (-1: a model input).
inline nlohmann::json ProfileTensor(int id, int64_t bytes, int producer, bool kept) {
  return nlohmann::json{{"id", id},           {"shape", {bytes / 4}}, {"dtype", "Float"},
                        {"bytes", bytes},     {"requires_grad", producer >= 0},
                        {"producer", producer}, {"kept", kept}};
}

// An op record with one output.
inline nlohmann::json ProfileOp(int id, const char* kind, const char* module, std::vector<int> inputs, int output,
                                int64_t saved, int64_t fwd_tmp, int64_t bwd_tmp, double fwd_ms, double bwd_ms) {
  return nlohmann::json{{"id", id},           {"kind", kind},       {"module", module},
                        {"inputs", inputs},   {"outputs", {output}}, {"saved_bytes", saved},
                        {"fwd_tmp_bytes", fwd_tmp}, {"bwd_tmp_bytes", bwd_tmp},
                        {"fwd_ms", fwd_ms},   {"bwd_ms", bwd_ms}};
}

// An op record of the chain-shaped test profiles: 800 B saved, 800 B of
// backward transient, 1 ms forward, 2 ms backward.
inline nlohmann::json ChainOp(int id, const char* kind, const char* module, std::vector<int> inputs, int output) {
  return ProfileOp(id, kind, module, std::move(inputs), output, 800, 0, 800, 1.0, 2.0);
}

inline nlohmann::json TwoBlockProfile() {
  const auto& tensor = ProfileTensor;
  const auto& op = ProfileOp;
  return {{"schema", "ckplan.profile/1"},
          {"model", {{"path", "two_blocks.pt"}}},
          {"totals",
           {{"param_bytes", 0}, {"buffer_bytes", 0}, {"input_bytes", 1000}, {"saved_bytes", 2800},
            {"output_bytes", 800}, {"fwd_ms", 3.875}, {"bwd_ms", 6.875}, {"peak_bytes", 9000}}},
          {"inputs", {0}},
          {"outputs", {5}},
          {"tensors",
           {tensor(0, 1000, -1, false), tensor(1, 2000, 0, false), tensor(2, 2000, 1, true),
            tensor(3, 800, 2, false), tensor(4, 800, 3, true), tensor(5, 800, 4, false)}},
          {"ops",
           {op(0, "aten::linear", "a.fc", {0}, 1, 0, 100, 500, 1.0, 2.0),
            op(1, "aten::relu", "a.act", {1}, 2, 2000, 0, 2000, 0.5, 0.25),
            op(2, "aten::linear", "b.fc", {2}, 3, 0, 50, 3000, 2.0, 4.0),
            op(3, "aten::tanh", "b.act", {3}, 4, 800, 0, 800, 0.125, 0.5),
            op(4, "aten::add", "b", {4, 2}, 5, 0, 0, 0, 0.25, 0.125)}}};
}

// An encoder-decoder: x (the model input) -> enc.fc -> enc.act (the
// encoder's output, read by every decoder block); dec.embed embeds x again,
// then dec.block0 and dec.block1 read the hidden state and the encoder's
// output; head reads the last. Each op saves 800 B.
inline nlohmann::json EncoderDecoderProfile() {
  const auto& op = ChainOp;
  return {{"schema", "ckplan.profile/1"},
          {"model", {{"path", "enc_dec.pt2"}}},
          {"totals",
           {{"param_bytes", 0}, {"buffer_bytes", 0}, {"input_bytes", 1000}, {"saved_bytes", 4800},
            {"output_bytes", 800}, {"fwd_ms", 6.0}, {"bwd_ms", 12.0}, {"peak_bytes", 9000}}},
          {"inputs", {0}},
          {"outputs", {6}},
          {"tensors",
           {ProfileTensor(0, 1000, -1, false), ProfileTensor(1, 800, 0, true), ProfileTensor(2, 800, 1, true),
            ProfileTensor(3, 800, 2, true), ProfileTensor(4, 800, 3, true), ProfileTensor(5, 800, 4, true),
            ProfileTensor(6, 800, 5, false)}},
          {"ops",
           {op(0, "aten::linear", "enc.fc", {0}, 1), op(1, "aten::relu", "enc.act", {1}, 2),
            op(2, "aten::embedding", "dec.embed", {0}, 3), op(3, "aten::linear", "dec.block0", {3, 2}, 4),
            op(4, "aten::linear", "dec.block1", {4, 2}, 5), op(5, "aten::linear", "head", {5}, 6)}}};
}

}  // namespace ckplan::testing
