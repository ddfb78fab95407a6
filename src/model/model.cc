#include "model/model.h"

#include <filesystem>

#include "io/text_file.h"

namespace dsv4 {

RopeParams rope_params(const ModelConfig& c, bool compressed) {
  RopeParams p;
  p.rotary_dim = c.qk_rope_head_dim;
  p.theta = compressed ? c.compress_rope_theta : c.rope_theta;
  if (compressed) {
    p.yarn_factor = c.rope_factor;
    p.yarn_original_max_position = c.rope_original_max_position;
    p.yarn_beta_fast = c.rope_beta_fast;
    p.yarn_beta_slow = c.rope_beta_slow;
  }
  return p;
}

std::unique_ptr<Model> Model::load(const std::string& dir, ExpertRange experts) {
  require_directory(dir, "model directory");
  auto m = std::make_unique<Model>();
  m->config = ModelConfig::load((std::filesystem::path(dir) / "config.json").string());
  m->checkpoint = Checkpoint::open(dir);
  m->weights = load_weights(m->checkpoint, m->config, experts);
  m->experts = {experts.begin, experts.end < 0 ? m->config.n_routed_experts : experts.end};
  m->rope_swa = RopeTable(rope_params(m->config, false));
  m->rope_compressed = RopeTable(rope_params(m->config, true));
  return m;
}

}  // namespace dsv4
