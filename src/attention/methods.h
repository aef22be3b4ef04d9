// Constructors of the concrete CPU attention methods (one file each) and their common base.
#pragma once

#include <memory>

#include "retroinfer/attention.h"

namespace retroinfer::attention {

class MethodBase : public AttentionMethod {
 public:
  MethodBase(const AttentionConfig& cfg, const AttentionShape& shape) : cfg_(cfg), shape_(shape) {}
  const AttentionShape& shape() const override { return shape_; }
  const AttentionConfig& config() const override { return cfg_; }
  AttentionKind kind() const override { return cfg_.kind; }

 protected:
  int group() const { return shape_.num_heads_q / shape_.num_heads_kv; }
  // Checks that kv matches the shape (heads, head_dim) and is non-empty; throws Error otherwise.
  void check_kv(const KvCache& kv) const;

  AttentionConfig cfg_;
  AttentionShape shape_;
};

std::unique_ptr<AttentionMethod> make_full(const AttentionConfig& cfg, const AttentionShape& shape);
std::unique_ptr<AttentionMethod> make_retro(const AttentionConfig& cfg, const AttentionShape& shape);
std::unique_ptr<AttentionMethod> make_quest(const AttentionConfig& cfg, const AttentionShape& shape);
std::unique_ptr<AttentionMethod> make_streaming(const AttentionConfig& cfg, const AttentionShape& shape);
std::unique_ptr<AttentionMethod> make_oracle(const AttentionConfig& cfg, const AttentionShape& shape);

}  // namespace retroinfer::attention
