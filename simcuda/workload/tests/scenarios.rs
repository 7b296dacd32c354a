//! Every `simcuda-workload` scenario run against the stand-ins on a small simulated device, with
//! its figures asserted exactly: the H200 fragmentation OOM, 2 MiB page sharing, the allocation
//! slack, concurrent allocation, VMM accounting and argument checks, stream-ordered pools, and the
//! event sequence of every driver entry-point route.

mod common;

use common::*;

#[test]
fn frag_oom_fails_the_2_5_gib_request_with_the_h200_figures() {
    let sim = Sim::new("frag-oom", "16GiB", "512MiB");
    let out = sim.run(&["frag-oom"]);
    let usable = 16 * GIB - 512 * MIB;
    assert_fields(&step(&out, "balloon"), &[("size", usable - 12 * GIB), ("rc", 0)]);
    let free = 12 * GIB - 20 * 500 * MIB;
    assert_fields(
        &step(&out, "before_request"),
        &[
            ("device_free", free),
            ("reserved", 10_485_760_000),
            ("allocated", 8_388_608_000),
            ("stranded", 2_097_152_000),
            ("releasable", 0),
            ("largest_free_block", 200 * MIB),
            ("segments", 20),
        ],
    );
    let oom = step(&out, "oom");
    assert_fields(
        &oom,
        &[
            ("requested", 2_684_354_560),
            ("segment_size", 2_684_354_560),
            ("rc", 2),
            ("device_free", free),
            ("total", usable),
            ("num_alloc_retries", 1),
            ("num_ooms", 1),
        ],
    );
    assert_eq!(oom["error"], "cudaErrorMemoryAllocation");
    let message = out.lines().find_map(|l| l.strip_prefix("OOM_MESSAGE ")).expect("OOM_MESSAGE line");
    assert!(
        message.starts_with(
            "CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 15.50 GiB of which \
             2.23 GiB is free. Including non-PyTorch memory, this process has 13.27 GiB memory in use. Of the \
             allocated memory 7.81 GiB is allocated by PyTorch, and 1.95 GiB is reserved by PyTorch but unallocated."
        ),
        "{message}"
    );
    let events = lines(&out, "EVENT");
    let count = |kind: &str| events.iter().filter(|e| e["kind"] == kind).count();
    assert_eq!((count("segment_alloc"), count("block_alloc"), count("block_free"), count("oom")), (20, 30, 10, 1));
    // The balloon takes the start of device 0's region; the first segment follows it.
    assert_eq!(events[0]["addr"], format!("{:#x}", 0x7f00_0000_0000u64 + (usable - 12 * GIB)));
}

#[test]
fn small_allocations_share_pages_so_2_mib_fails_after_freeing_half() {
    // 256 MiB - 16 MiB reserve - 4 MiB slack = 118 pages of 2 MiB = 236 allocations of 1 MiB.
    let sim = Sim::new("small-pages", "256MiB", "16MiB");
    for args in [&["small-pages"][..], &["small-pages", "236"][..]] {
        let out = sim.run(args);
        assert_fields(&step(&out, "fill"), &[("allocated", 236), ("device_free", 4 * MIB)]);
        assert_fields(&step(&out, "free_every_other"), &[("freed", 118), ("freed_bytes", 118 * MIB), ("device_free", 4 * MIB)]);
        let requests = lines(&out, "RESULT").into_iter().filter(|l| l["step"] == "request").collect::<Vec<_>>();
        assert_fields(&requests[0], &[("size", 2 * MIB), ("rc", 2)]);
        assert_fields(&requests[1], &[("size", MIB), ("rc", 0)]);
        assert_fields(&step(&out, "cleanup"), &[("device_free", 240 * MIB), ("device_free_at_start", 240 * MIB)]);
    }
    assert_eq!(num(&step(&sim.run(&["small-pages"]), "fill"), "stop_rc"), 2);
}

#[test]
fn the_largest_request_that_succeeds_is_free_minus_the_slack() {
    let sim = Sim::new("slack", "256MiB", "16MiB");
    let ok = sim.run(&["basic", "236MiB"]);
    assert_fields(&lines(&ok, "RESULT")[0], &[("size", 236 * MIB), ("rc", 0), ("device_free", 4 * MIB)]);
    let too_big = sim.output(&["basic", &(236 * MIB + 1).to_string()]);
    assert_eq!(too_big.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&too_big.stderr).contains("cudaErrorMemoryAllocation"));
    let sim = Sim::new("slack0", "256MiB", "16MiB").env("SIMCUDA_SLACK", "0");
    sim.run(&["basic", "240MiB"]);
}

#[test]
fn threads_allocate_concurrently_without_loss() {
    let sim = Sim::new("threads", "4GiB", "64MiB");
    let out = sim.run(&["threads", "4", "250"]);
    let r = &lines(&out, "RESULT")[0];
    let usable = 4 * GIB - 64 * MIB;
    assert_fields(r, &[("ok", 1000), ("failed", 0), ("device_free_before", usable), ("device_free_after", usable)]);
}

#[test]
fn vmm_accounts_mapped_physical_memory_and_refuses_bad_arguments() {
    let sim = Sim::new("vmm", "1GiB", "64MiB");
    let out = sim.run(&["vmm"]);
    let usable = 960 * MIB;
    let r = step(&out, "reserve");
    assert_fields(&r, &[("granularity", 2 * MIB), ("size", GIB), ("device_free", usable)]);
    assert_eq!(r["addr"], "0x500000000000");
    assert_fields(&step(&out, "grow"), &[("mapped", 100 * MIB), ("device_free", usable - 100 * MIB)]);
    assert_fields(&step(&out, "shrink_end"), &[("mapped", 80 * MIB), ("device_free", usable - 80 * MIB)]);
    assert_fields(&step(&out, "shrink_middle"), &[("mapped", 60 * MIB), ("device_free", usable - 60 * MIB)]);
    assert_fields(
        &step(&out, "release_then_unmap"),
        &[("device_free_after_release", usable - 80 * MIB), ("device_free_after_unmap", usable - 60 * MIB)],
    );
    assert_fields(
        &step(&out, "offset_maps"),
        &[("device_free_one_half_mapped", usable - 100 * MIB), ("device_free_after", usable - 60 * MIB)],
    );
    let bad = step(&out, "bad_args");
    let checks: Vec<&String> = bad.keys().filter(|k| !["test", "step"].contains(&k.as_str())).collect();
    assert_eq!(checks.len(), 12, "{bad:?}");
    for k in checks {
        assert_eq!(bad[k], "1", "{k}: CUDA_ERROR_INVALID_VALUE expected");
    }
    assert_fields(&step(&out, "cleanup"), &[("device_free", usable)]);
}

#[test]
fn pools_keep_freed_memory_reserved_until_trim() {
    let sim = Sim::new("async", "1GiB", "64MiB");
    let out = sim.run(&["async"]);
    let usable = 960 * MIB;
    assert_fields(&step(&out, "alloc"), &[("pool_reserved", 192 * MIB), ("pool_used", 192 * MIB), ("device_free", usable - 192 * MIB)]);
    assert_fields(&step(&out, "free"), &[("pool_reserved", 192 * MIB), ("pool_used", 0), ("device_free", usable - 192 * MIB)]);
    assert_fields(&step(&out, "reuse"), &[("same_addr", 1), ("pool_reserved", 192 * MIB), ("device_free", usable - 192 * MIB)]);
    assert_fields(&step(&out, "trim_keep"), &[("pool_reserved", 64 * MIB), ("device_free", usable - 64 * MIB)]);
    assert_fields(&step(&out, "trim"), &[("pool_reserved", 0), ("device_free", usable)]);
    assert_fields(
        &step(&out, "sync"),
        &[("pool_reserved_before_sync", 64 * MIB), ("pool_reserved_after_sync", 0), ("pool_reserved_after_sync_threshold_max", 64 * MIB)],
    );
    // 10 MiB and 1000 bytes: two chunks (10 MiB, 2 MiB); the 10 MiB block freed, 1024 bytes used.
    assert_fields(&step(&out, "driver_pool"), &[("pool_reserved", 12 * MIB), ("pool_used", 1024), ("device_free", usable - 12 * MIB)]);
    assert_fields(&step(&out, "driver_trim"), &[("trim_rc", 0), ("destroy_rc", 0), ("device_free", usable)]);
}

#[test]
fn every_route_makes_its_own_known_call_sequence() {
    let sim = Sim::new("routes", "1GiB", "64MiB");
    let out = sim.run(&["routes"]);
    let ops = lines(&out, "OP");
    let routes = [
        ("direct", 3, "cuMemAlloc_v2", "cuMemFree_v2"),
        ("dlsym", 7, "cuMemAlloc_v2", "cuMemFree_v2"),
        ("getproc", 11, "cuMemAlloc_v2", "cuMemFree_v2"),
        ("getproc-v1", 15, "cuMemAlloc_v2", "cuMemFree_v2"),
        ("entrypoint", 19, "cuMemAlloc_v2", "cuMemFree_v2"),
        ("entrypoint-noversion", 23, "cuMemAlloc_v2", "cuMemFree_v2"),
        ("ptsz", 27, "cuMemAllocAsync_ptsz", "cuMemFreeAsync_ptsz"),
        ("getproc-ptsz", 31, "cuMemAllocAsync_ptsz", "cuMemFreeAsync_ptsz"),
        ("runtime", 35, "cudaMalloc", "cudaFree"),
    ];
    assert_eq!(ops.len(), 4 * routes.len(), "{out}");
    for (chunk, (route, first, alloc, free)) in ops.chunks(4).zip(routes) {
        for op in chunk {
            assert_eq!((op["route"].as_str(), op["rc"].as_str()), (route, "0"), "{op:?}");
        }
        assert_eq!((chunk[0]["fn"].as_str(), num(&chunk[0], "size")), (alloc, first * MIB));
        assert_eq!((chunk[1]["fn"].as_str(), num(&chunk[1], "size")), (alloc, (first + 2) * MIB));
        assert_eq!((chunk[2]["fn"].as_str(), &chunk[2]["addr"]), (free, &chunk[0]["addr"]));
        assert_eq!((chunk[3]["fn"].as_str(), &chunk[3]["addr"]), (free, &chunk[1]["addr"]));
    }
    assert_eq!((ops[0]["addr"].as_str(), ops[1]["addr"].as_str()), ("0x7f0000000000", "0x7f0000400000"));
    let one = sim.run(&["routes", "ptsz"]);
    assert_eq!(lines(&one, "OP").len(), 4);
    assert_eq!(sim.output(&["routes", "nowhere"]).status.code(), Some(1));
}

#[test]
fn bad_configuration_and_usage_are_reported() {
    let sim = Sim::new("bad-config", "1GiB", "2GiB");
    let out = sim.output(&["basic"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("SIMCUDA_MEM") && stderr.contains("cudaErrorNoDevice"), "{stderr}");
    assert_eq!(sim.output(&["no-such-command"]).status.code(), Some(2));
}
