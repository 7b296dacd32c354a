# A stand-in for the few torch entry points gpufrag's Python hook touches, so that CI (no GPU, no
# PyTorch) can test the hook's plumbing: import hook, lazy-init wrap, frames, consumer side. The
# real torch is exercised on the GPU machine (docs/gpu-validation.md).
from . import _C, cuda  # noqa: F401
