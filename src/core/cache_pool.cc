#include "core/cache_pool.h"

#include <sys/mman.h>

#include <climits>
#include <cstring>

#include "core/arith.h"
#include "core/error.h"

namespace dsv4 {

CachePool::CachePool(size_t bytes, size_t page_bytes) : page_bytes_(page_bytes) {
  if (page_bytes == 0 || page_bytes % 64 != 0) throw Error("cache pool: page size must be a positive multiple of 64");
  total_pages_ = bytes / page_bytes;
  bytes_ = total_pages_ * page_bytes;
  if (bytes_ > 0) {
    // Anonymous mapping: untouched pages cost no memory.
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw Error("cache pool: cannot reserve " + std::to_string(bytes_ >> 20) + " MiB");
    base_ = static_cast<uint8_t*>(p);
  }
  if (total_pages_ > size_t(INT32_MAX)) throw Error("cache pool: too many pages; raise the page size");
}

CachePool::~CachePool() {
  if (base_) munmap(base_, bytes_);
}

int32_t CachePool::alloc() {
  if (!free_list_.empty()) {
    int32_t id = free_list_.back();
    free_list_.pop_back();
    return id;
  }
  return next_fresh_ < total_pages_ ? int32_t(next_fresh_++) : -1;
}

void CachePool::free(int32_t page) { free_list_.push_back(page); }

PagedRows::PagedRows(CachePool* pool, size_t row_bytes) : pool_(pool), row_bytes_(row_bytes) {
  if (row_bytes == 0 || row_bytes > pool->page_bytes())
    throw Error("cache pool: a row of " + std::to_string(row_bytes) + " bytes does not fit a page of " +
                std::to_string(pool->page_bytes()) + " bytes (raise the page size)");
  rows_per_page_ = pool->page_bytes() / row_bytes;
}

PagedRows& PagedRows::operator=(PagedRows&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = o.pool_;
    row_bytes_ = o.row_bytes_;
    rows_per_page_ = o.rows_per_page_;
    table_ = std::move(o.table_);
    o.table_.clear();
  }
  return *this;
}

size_t PagedRows::pages_missing(int64_t rows) const {
  const size_t need = ceil_div(size_t(rows), rows_per_page_);
  return need > table_.size() ? need - table_.size() : 0;
}

void PagedRows::reserve(int64_t rows) {
  size_t missing = pages_missing(rows);
  if (missing > pool_->free_pages())
    throw Error("cache pool exhausted: the request needs " + std::to_string(missing) + " more pages of " +
                std::to_string(pool_->page_bytes()) + " bytes, " + std::to_string(pool_->free_pages()) +
                " are free (raise --cache-pool-mb)");
  for (size_t i = 0; i < missing; ++i) {
    int32_t id = pool_->alloc();
    // Every request starts from empty state: a reused page must not leak
    // the previous owner's rows.
    std::memset(pool_->page(id), 0, pool_->page_bytes());
    table_.push_back(id);
  }
}

void PagedRows::copy_from(const PagedRows& src) {
  if (!table_.empty() || row_bytes_ != src.row_bytes_ || pool_->page_bytes() != src.pool_->page_bytes())
    throw Error("cache pool: a copy needs an empty array of the same row and page size");
  reserve(int64_t(src.table_.size() * rows_per_page_));
  for (size_t i = 0; i < table_.size(); ++i)
    std::memcpy(pool_->page(table_[i]), src.pool_->page(src.table_[i]), pool_->page_bytes());
}

void PagedRows::release() {
  if (pool_)
    for (int32_t id : table_) pool_->free(id);
  table_.clear();
}

}  // namespace dsv4
