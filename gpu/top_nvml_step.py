# A steady holder for gpu/top_nvml.sh: takes about 8 GiB through PyTorch, keeps the GPU busy with
# matmuls for DURATION seconds (so utilization is not 0), then frees and exits. Writes its pid to
# $OUT/top_nvml_pid.
import os, sys, time, torch
open(os.path.join(os.environ["OUT"], "top_nvml_pid"), "w").write(str(os.getpid()))
hold = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda"); b = torch.randn(8192, 8192, device="cuda")
end = time.time() + float(os.environ.get("DURATION", "25"))
while time.time() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
print("reserved", torch.cuda.memory_reserved(), flush=True)
