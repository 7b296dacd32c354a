//! `vmm`: the virtual memory management API used the way PyTorch's expandable segments use it
//! (one large reserved range, physical chunks created and mapped at its end to grow, unmapped and
//! released to shrink, from the end and from the middle), the rule that released memory lives
//! until its last mapping goes, one handle mapped in two places by offset, and the invalid
//! arguments the real driver refuses with CUDA_ERROR_INVALID_VALUE.

use crate::ffi::*;
use crate::{hex, init_runtime, mem_info, ok, result, Outcome};

const MIB: u64 = 1 << 20;
const RANGE: u64 = 1 << 30;
const CHUNK: u64 = 20 * MIB;

fn create(size: u64) -> Result<u64, String> {
    let prop = device_prop(0);
    let mut h = 0;
    // SAFETY: valid out-pointer and prop.
    ok("cuMemCreate", unsafe { cuMemCreate(&mut h, size as usize, &prop, 0) })?;
    Ok(h)
}

fn map(at: u64, size: u64, offset: u64, h: u64) -> Outcome {
    // SAFETY: plain values; the driver validates them.
    ok("cuMemMap", unsafe { cuMemMap(at, size as usize, offset as usize, h, 0) })?;
    let desc = CUmemAccessDesc {
        location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: 0 },
        flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: one valid descriptor.
    ok("cuMemSetAccess", unsafe { cuMemSetAccess(at, size as usize, &desc, 1) })
}

fn unmap(at: u64, size: u64) -> Outcome {
    // SAFETY: plain values; the driver validates them.
    ok("cuMemUnmap", unsafe { cuMemUnmap(at, size as usize) })
}

fn release(h: u64) -> Outcome {
    // SAFETY: plain value; the driver validates it.
    ok("cuMemRelease", unsafe { cuMemRelease(h) })
}

fn free() -> Result<u64, String> {
    mem_info().map(|(f, _)| f)
}

pub fn vmm() -> Outcome {
    init_runtime()?;
    let prop = device_prop(0);
    let mut gran = 0usize;
    // SAFETY: valid out-pointer and prop.
    ok("cuMemGetAllocationGranularity", unsafe { cuMemGetAllocationGranularity(&mut gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) })?;
    let free0 = free()?;
    let mut base = 0;
    // SAFETY: valid out-pointer.
    ok("cuMemAddressReserve", unsafe { cuMemAddressReserve(&mut base, RANGE as usize, 0, 0, 0) })?;
    result!("test" = "vmm", "step" = "reserve", "granularity" = gran, "addr" = hex(base), "size" = RANGE, "device_free" = free()?);

    // Grow: five chunks mapped one after the other at the end of what is mapped.
    let mut handles = Vec::new();
    for i in 0..5 {
        let h = create(CHUNK)?;
        map(base + i * CHUNK, CHUNK, 0, h)?;
        handles.push(h);
    }
    result!("test" = "vmm", "step" = "grow", "chunks" = 5, "mapped" = 5 * CHUNK, "device_free" = free()?);

    // Shrink from the end, then from the middle.
    unmap(base + 4 * CHUNK, CHUNK)?;
    release(handles[4])?;
    result!("test" = "vmm", "step" = "shrink_end", "mapped" = 4 * CHUNK, "device_free" = free()?);
    unmap(base + CHUNK, CHUNK)?;
    release(handles[1])?;
    result!("test" = "vmm", "step" = "shrink_middle", "mapped" = 3 * CHUNK, "device_free" = free()?);

    // Released while mapped: the memory stays until the unmap.
    let h = create(CHUNK)?;
    map(base + CHUNK, CHUNK, 0, h)?;
    release(h)?;
    let after_release = free()?;
    unmap(base + CHUNK, CHUNK)?;
    result!(
        "test" = "vmm",
        "step" = "release_then_unmap",
        "device_free_after_release" = after_release,
        "device_free_after_unmap" = free()?,
    );

    // One 40 MiB handle mapped as two halves by offset, released, then unmapped half by half.
    let h = create(2 * CHUNK)?;
    map(base + 10 * CHUNK, CHUNK, 0, h)?;
    map(base + 12 * CHUNK, CHUNK, CHUNK, h)?;
    release(h)?;
    unmap(base + 10 * CHUNK, CHUNK)?;
    let one_half = free()?;
    unmap(base + 12 * CHUNK, CHUNK)?;
    result!("test" = "vmm", "step" = "offset_maps", "device_free_one_half_mapped" = one_half, "device_free_after" = free()?);

    // Invalid arguments.
    let h0 = handles[0];
    let mut p = 0;
    let mut h = 0;
    // SAFETY: each call gets plain values and valid out-pointers; the driver validates the rest.
    let bad = unsafe {
        [
            ("map_unaligned", cuMemMap(base + 4096, CHUNK as usize, 0, h0, 0)),
            ("map_bad_size", cuMemMap(base + 20 * CHUNK, CHUNK as usize + 4096, 0, h0, 0)),
            ("map_outside", cuMemMap(base + RANGE, CHUNK as usize, 0, h0, 0)),
            ("map_overlap", cuMemMap(base, CHUNK as usize, 0, h0, 0)),
            ("map_offset_past_handle", cuMemMap(base + 30 * CHUNK, CHUNK as usize, CHUNK as usize, h0, 0)),
            ("map_released_handle", cuMemMap(base + 30 * CHUNK, CHUNK as usize, 0, handles[4], 0)),
            ("create_bad_size", cuMemCreate(&mut h, CHUNK as usize + 4096, &prop, 0)),
            ("unmap_unmapped", cuMemUnmap(base + 40 * CHUNK, CHUNK as usize)),
            ("unmap_partial", cuMemUnmap(base, 2 * MIB as usize)),
            ("release_twice", cuMemRelease(handles[4])),
            ("reserve_bad_size", cuMemAddressReserve(&mut p, 4096, 0, 0, 0)),
            ("free_mapped_range", cuMemAddressFree(base, RANGE as usize)),
        ]
    };
    let mut line = String::from("RESULT test=vmm step=bad_args");
    for (name, rc) in bad {
        line.push_str(&format!(" {name}={rc}"));
    }
    println!("{line}");

    for i in [0, 2, 3] {
        unmap(base + i * CHUNK, CHUNK)?;
        release(handles[i as usize])?;
    }
    // SAFETY: the whole reserved range, now unmapped.
    ok("cuMemAddressFree", unsafe { cuMemAddressFree(base, RANGE as usize) })?;
    let free_end = free()?;
    result!("test" = "vmm", "step" = "cleanup", "device_free" = free_end, "device_free_at_start" = free0);
    if bad.iter().all(|&(_, rc)| rc == CUDA_ERROR_INVALID_VALUE) && free_end == free0 {
        Ok(())
    } else {
        Err("an invalid argument was accepted, or memory leaked".to_string())
    }
}
