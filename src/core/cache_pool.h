// The paged cache pool of PREFILL.md §2: fixed-size pages handed to requests,
// per-request block tables, rows addressed through logical slots. A request
// that cannot get pages fails alone: the pool and other requests are
// untouched, and a request's pages return to the pool when it is freed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace dsv4 {

class CachePool {
 public:
  // `bytes` of address space in pages of `page_bytes`; memory is only
  // committed as pages are first written.
  explicit CachePool(size_t bytes, size_t page_bytes = kDefaultPageBytes);
  ~CachePool();
  CachePool(const CachePool&) = delete;
  CachePool& operator=(const CachePool&) = delete;

  static constexpr size_t kDefaultPageBytes = 64 << 10;

  // A free page id, or -1 when the pool is exhausted.
  int32_t alloc();
  void free(int32_t page);
  uint8_t* page(int32_t id) const { return base_ + size_t(id) * page_bytes_; }
  size_t page_bytes() const { return page_bytes_; }
  size_t total_pages() const { return total_pages_; }
  size_t free_pages() const { return free_list_.size() + (total_pages_ - next_fresh_); }

 private:
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0, page_bytes_ = 0, total_pages_ = 0;
  size_t next_fresh_ = 0;           // pages never handed out start here
  std::vector<int32_t> free_list_;  // pages given back
};

// An array of fixed-width rows stored in pool pages through a block table.
// Row r lives in page table[r / rows_per_page] at offset r % rows_per_page.
class PagedRows {
 public:
  PagedRows() = default;
  PagedRows(CachePool* pool, size_t row_bytes);
  ~PagedRows() { release(); }
  PagedRows(PagedRows&& o) noexcept { *this = std::move(o); }
  PagedRows& operator=(PagedRows&& o) noexcept;
  PagedRows(const PagedRows&) = delete;
  PagedRows& operator=(const PagedRows&) = delete;

  // Pages needed to hold `rows` rows that this array does not hold yet.
  size_t pages_missing(int64_t rows) const;
  // Makes rows [0, rows) addressable; throws dsv4::Error naming the pool
  // when it is exhausted (pages taken so far by this call are given back).
  void reserve(int64_t rows);
  uint8_t* row(int64_t r) const {
    return pool_->page(table_[size_t(r / int64_t(rows_per_page_))]) + size_t(r % int64_t(rows_per_page_)) * row_bytes_;
  }
  float* row_f32(int64_t r) const { return reinterpret_cast<float*>(row(r)); }
  uint16_t* row_bf16(int64_t r) const { return reinterpret_cast<uint16_t*>(row(r)); }
  size_t pages() const { return table_.size(); }
  size_t bytes_held() const { return pool_ ? table_.size() * pool_->page_bytes() : 0; }
  size_t row_bytes() const { return row_bytes_; }
  CachePool* pool() const { return pool_; }
  void release();
  // Makes this (empty) array hold a copy of every page `src` holds, from
  // this array's pool; on a full pool it throws and holds nothing.
  void copy_from(const PagedRows& src);

 private:
  CachePool* pool_ = nullptr;
  size_t row_bytes_ = 0, rows_per_page_ = 0;
  std::vector<int32_t> table_;
};

}  // namespace dsv4
