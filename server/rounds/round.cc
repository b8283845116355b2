#include "server/rounds/round.h"

#include <algorithm>

#include <cstring>

#include "common/topology/topology.h"
#include "common/reduce/sum.h"

namespace dlcp::server {

Round::Round(std::shared_ptr<Job> job, uint32_t key, uint32_t round, wire::ChunkGeometry geometry, BlockPool* pool,
             absl::Time now, uint32_t epoch)
    : job_(std::move(job)),
      key_(key),
      round_(round),
      epoch_(epoch != 0 ? epoch : job_->epoch.load()),
      geometry_(geometry),
      pool_(pool),
      block_bytes_(static_cast<size_t>(kBlockChunks) * geometry.chunk_elems * sizeof(float)),
      words_((job_->world + 63) / 64),
      blocks_((geometry.chunk_count() + kBlockChunks - 1) / kBlockChunks, nullptr),
      got_(static_cast<size_t>(geometry.chunk_count()) * words_, 0),
      contributors_(geometry.chunk_count(), 0),
      results_(job_->world, geometry.chunk_count(), now),
      done_(job_->world, false),
      delivered_us_(job_->world, 0),
      created_(now),
      last_progress_(now),
      first_contribution_(now) {
  job_->rounds_in_flight.fetch_add(1, std::memory_order_relaxed);
}

Round::~Round() {
  for (float* b : blocks_) {
    if (b != nullptr) {
      pool_->Put(b, block_bytes_);
      job_->bytes_in_use.fetch_sub(block_bytes_, std::memory_order_relaxed);
      if (job_->memory) job_->memory->Give(block_bytes_);
    }
  }
  job_->rounds_in_flight.fetch_sub(1, std::memory_order_relaxed);
}

float* Round::ChunkPtr(uint32_t chunk) const {
  float* block = blocks_[chunk / kBlockChunks];
  return block == nullptr ? nullptr : block + static_cast<size_t>(chunk % kBlockChunks) * geometry_.chunk_elems;
}

const float* Round::Result(uint32_t chunk) const { return contributors_[chunk] == 0 ? nullptr : ChunkPtr(chunk); }

bool Round::Has(uint32_t rank, uint32_t chunk) const {
  return (got_[static_cast<size_t>(chunk) * words_ + rank / 64] >> (rank % 64)) & 1;
}

Round::AddResult Round::Add(uint32_t rank, uint32_t chunk, const float* payload, absl::Time now,
                            std::shared_ptr<const std::vector<uint32_t>> host_group) {
  uint64_t& word = got_[static_cast<size_t>(chunk) * words_ + rank / 64];
  const uint64_t bit = uint64_t{1} << (rank % 64);
  if (word & bit) return AddResult::kDuplicate;
  if (sealed_) return AddResult::kSealed;
  float*& block = blocks_[chunk / kBlockChunks];
  if (block == nullptr) {
    if (job_->bytes_in_use.load(std::memory_order_relaxed) + block_bytes_ > job_->max_bytes) {
      return AddResult::kNoMemory;
    }
    if (job_->memory && !job_->memory->TryTake(block_bytes_)) return AddResult::kNoAggregatorMemory;
    block = pool_->Get(block_bytes_);
    if (block == nullptr) {
      if (job_->memory) job_->memory->Give(block_bytes_);
      return AddResult::kNoMemory;
    }
    job_->bytes_in_use.fetch_add(block_bytes_, std::memory_order_relaxed);
  }
  float* dst = ChunkPtr(chunk);
  const uint32_t n = geometry_.elems(chunk);
  if (contributors_[chunk] == 0) {
    std::memcpy(dst, payload, n * sizeof(float));
    ++open_chunks_;
  } else {
    reduce::SumInto(dst, payload, n);
  }
  word |= bit;
  last_progress_ = now;
  delivered_us_[rank] = MicrosSinceCreated(now);
  if (contributions_++ == 0) first_contribution_ = now;
  if (bounded) bounded->OnContribution(rank, chunk);
  uint32_t added = 1;
  if (host_group != nullptr) {
    CarryGroup(host_group);
    added += MarkCarried(*host_group, chunk, now);
  }
  contributors_[chunk] = static_cast<uint16_t>(contributors_[chunk] + added);
  if (contributors_[chunk] == job_->world) {
    --open_chunks_;
    return AddResult::kCompleted;
  }
  return AddResult::kAdded;
}

std::shared_ptr<const std::vector<uint32_t>> Round::HostGroupLedBy(uint32_t rank) const {
  for (const auto& g : host_groups_) {
    if (g->front() == rank) return g;
  }
  return nullptr;
}

uint32_t Round::MarkCarried(const std::vector<uint32_t>& group, uint32_t chunk, absl::Time now) {
  uint32_t added = 0;
  for (size_t i = 1; i < group.size(); ++i) {
    const uint32_t member = group[i];
    uint64_t& word = got_[static_cast<size_t>(chunk) * words_ + member / 64];
    const uint64_t bit = uint64_t{1} << (member % 64);
    if (word & bit) continue;  // it pushed this chunk itself: never counted twice
    word |= bit;
    delivered_us_[member] = MicrosSinceCreated(now);
    if (bounded) bounded->OnContribution(member, chunk);
    ++added;
  }
  return added;
}

void Round::CarryGroup(std::shared_ptr<const std::vector<uint32_t>> group) {
  if (HostGroupLedBy(group->front()) != nullptr) return;
  if (carried_.empty()) carried_.assign(job_->world, false);
  for (size_t i = 1; i < group->size(); ++i) carried_[(*group)[i]] = true;
  host_groups_.push_back(std::move(group));
}

uint32_t Round::CarrierOf(uint32_t rank) const {
  for (const auto& g : host_groups_) {
    if (std::find(g->begin() + 1, g->end(), rank) != g->end()) return g->front();
  }
  return rank;
}

LossTracker& Round::EnableBounded() {
  if (!bounded) {
    bounded = std::make_unique<LossTracker>(job_->world, geometry_.chunk_count());
    for (uint32_t w = 0; w < job_->world; ++w) {
      for (uint32_t c = 0; c < geometry_.chunk_count(); ++c) {
        if (Has(w, c)) bounded->OnContribution(w, c);
      }
    }
  }
  return *bounded;
}

std::vector<uint32_t> Round::MissingFrom(uint32_t rank) const {
  std::vector<uint32_t> out;
  for (uint32_t c = 0; c < contributors_.size(); ++c) {
    if (contributors_[c] != 0 && contributors_[c] != job_->world && !Has(rank, c)) out.push_back(c);
  }
  return out;
}

bool Round::MarkDone(uint32_t rank) {
  if (done_[rank]) return false;
  done_[rank] = true;
  ++done_count_;
  if (const std::shared_ptr<const std::vector<uint32_t>> group = HostGroupLedBy(rank)) {
    for (size_t i = 1; i < group->size(); ++i) {
      if (!done_[(*group)[i]]) {
        done_[(*group)[i]] = true;
        ++done_count_;
      }
    }
  }
  return true;
}

}  // namespace dlcp::server
