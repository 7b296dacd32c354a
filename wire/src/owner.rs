//! The library that made a driver allocation (issue 25, item 3): a small bounded set of owners,
//! the rule that files a caller's file under one, and their wire values.
//!
//! The shim puts the return address of the outermost tracked call in the event (`handle` of a
//! `MemAlloc*`, `stream` of a `PhysCreate`: fields those kinds leave unused); the consumer maps it
//! to the file holding it (`/proc/PID/maps`, while the process is alive) and stores the owner's
//! wire value in `op` with [`F_OWNER_KNOWN`](crate::event::F_OWNER_KNOWN), so that a record
//! replays to the owners the live run saw. The set is bounded on purpose: it is a metric
//! attribute, and any other file is `other`.

/// Who took a driver allocation. The numbering is the wire format: never renumber, only append.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// cuBLAS and cuBLASLt (`libcublas*`, `libcublasLt*`): their workspaces.
    Cublas = 1,
    /// cuDNN (`libcudnn*`).
    Cudnn = 2,
    /// NCCL (`libnccl*`): its buffers and channels.
    Nccl = 3,
    /// The CUDA runtime's own allocations (`libcudart*` calling the driver itself).
    CudaRuntime = 4,
    /// The framework (`libtorch*`, `libc10*`: its caching allocator and graph pools).
    Framework = 5,
    /// Any other file: the program itself, another library, or an address no file maps.
    Other = 6,
}

impl Owner {
    /// Every owner, in wire order.
    pub const ALL: [Owner; 6] = [Owner::Cublas, Owner::Cudnn, Owner::Nccl, Owner::CudaRuntime, Owner::Framework, Owner::Other];

    /// Decodes a wire value; `None` for 0 (not attributed) and unknown values.
    pub fn from_u16(v: u16) -> Option<Owner> {
        Owner::ALL.iter().copied().find(|o| *o as u16 == v)
    }

    /// The name in JSON, the report and the `gpufrag.owner` metric attribute.
    pub fn name(self) -> &'static str {
        match self {
            Owner::Cublas => "cublas",
            Owner::Cudnn => "cudnn",
            Owner::Nccl => "nccl",
            Owner::CudaRuntime => "cuda_runtime",
            Owner::Framework => "framework",
            Owner::Other => "other",
        }
    }

    /// The owner of code in the file at `path` (by its file name: `libcublas.so.12`,
    /// `libnccl.so.2`, `libcudart-d0da41ae.so.11.0` as wheels rename them).
    pub fn of_file(path: &str) -> Owner {
        let name = path.rsplit('/').next().unwrap_or(path);
        let has = |p: &str| name.starts_with(p);
        if has("libcublas") {
            Owner::Cublas
        } else if has("libcudnn") {
            Owner::Cudnn
        } else if has("libnccl") {
            Owner::Nccl
        } else if has("libcudart") {
            Owner::CudaRuntime
        } else if has("libtorch") || has("libc10") {
            Owner::Framework
        } else {
            Owner::Other
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_filed_by_name_and_values_round_trip() {
        assert_eq!(Owner::of_file("/usr/lib/x86_64-linux-gnu/libcublasLt.so.12.4.5"), Owner::Cublas);
        assert_eq!(Owner::of_file("/site-packages/nvidia/cudnn/lib/libcudnn_ops.so.9"), Owner::Cudnn);
        assert_eq!(Owner::of_file("libnccl.so.2"), Owner::Nccl);
        assert_eq!(Owner::of_file("/x/libcudart-d0da41ae.so.11.0"), Owner::CudaRuntime);
        assert_eq!(Owner::of_file("/torch/lib/libc10_cuda.so"), Owner::Framework);
        assert_eq!(Owner::of_file("/usr/bin/python3.12"), Owner::Other);
        assert_eq!(Owner::of_file("/opt/libcublas/mylib.so"), Owner::Other, "the file's name, not its folder");
        for o in Owner::ALL {
            assert_eq!(Owner::from_u16(o as u16), Some(o));
        }
        assert_eq!(Owner::from_u16(0), None);
        assert_eq!(Owner::from_u16(7), None);
    }
}
