# A program capped with torch.cuda.set_per_process_memory_fraction (FAKE_TORCH_FRACTION) asks for
# more than the allowed bytes: PyTorch's caching allocator refuses without a driver call and calls
# its OOM observers with (device, alloc_size, allowed bytes, device free).
import os
import torch

torch.cuda._lazy_init()
allowed = int(os.environ["FAKE_TORCH_ALLOWED"])
for obs in torch._C.observers:
    obs(0, 20 << 30, allowed, 141733920768)
print("CAPPED done", len(torch._C.observers))
