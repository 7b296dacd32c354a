# What a training script does as far as the hook can tell: import torch, use CUDA, hit an OOM.
import torch

torch.cuda._lazy_init()  # PyTorch's C++ side calls this on the first CUDA tensor
for obs in torch._C.observers:  # the caching allocator calls its OOM observers before raising
    obs(0, 2684354560, 8388608000, 2398224384)
print("TRAIN done", len(torch._C.observers))
