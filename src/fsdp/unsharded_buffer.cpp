// UnshardedBuffer: an anonymous mapping on the CPU, so resharding gives the pages back to the OS
// (MADV_DONTNEED) while the address the saved tensors of backward hold stays valid for the
// re-gather; CUDA memory comes from kiln's allocator and stays allocated.
#include <sys/mman.h>

#include "core/storage.h"
#include "fsdp/fsdp_state.h"

namespace kiln::dist::detail {

UnshardedBuffer::UnshardedBuffer(Device device, size_t nbytes) : device_(device), nbytes_(nbytes) {
  if (nbytes_ == 0) return;
  if (device.is_cuda()) {
    data_ = allocate_bytes(device, nbytes_);
    return;
  }
  void* p = mmap(nullptr, nbytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  KILN_CHECK(p != MAP_FAILED, "fully_shard", "cannot map ", nbytes_, " bytes for unsharded parameters");
  data_ = p;
  mapped_ = true;
}

UnshardedBuffer::~UnshardedBuffer() {
  if (data_ == nullptr) return;
  if (mapped_) munmap(data_, nbytes_);
  else free_bytes(device_, data_, nbytes_);
}

Tensor UnshardedBuffer::view(int64_t offset, const Shape& shape, DType dtype) const {
  char* base = static_cast<char*>(data_) + offset * static_cast<int64_t>(element_size(dtype));
  return from_blob(base, shape, TensorOptions().dtype(dtype).device(device_));
}

void UnshardedBuffer::release() {
  if (mapped_) madvise(data_, nbytes_, MADV_DONTNEED);
}

}  // namespace kiln::dist::detail
