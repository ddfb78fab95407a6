#include "model/model.h"

#include <filesystem>

namespace dsv4 {

std::unique_ptr<Model> Model::load(const std::string& dir, ExpertRange experts) {
  auto m = std::make_unique<Model>();
  m->config = ModelConfig::load((std::filesystem::path(dir) / "config.json").string());
  m->checkpoint = Checkpoint::open(dir);
  m->weights = load_weights(m->checkpoint, m->config, experts);
  m->experts = {experts.begin, experts.end < 0 ? m->config.n_routed_experts : experts.end};
  m->rope_swa = RopeTable(m->config, false);
  m->rope_compressed = RopeTable(m->config, true);
  return m;
}

}  // namespace dsv4
