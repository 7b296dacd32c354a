import os

CUDA_HOME = None


def include_paths(device_type="cpu"):
    return [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "include")]


def library_paths(device_type="cpu"):
    return [os.environ["FAKE_TORCH_LIB"]]
