//! fork and exec under the shim (`simcuda-workload fork-exec`: the parent allocates, forks; the
//! child allocates, then execs `basic 16MiB`). The documented behaviour:
//!
//! - a fork child is re-armed lazily: its first hooked call opens its own ring and connection,
//!   with `HELLO_F_FORKED`; the parent's ring is never written by the child;
//! - an exec'd image runs the shim's constructor again and connects as a new process image (same
//!   pid, no fork flag); the pre-exec connection ends without `ProcessExit`;
//! - `GPUFRAG_NO_FOLLOW=1` with `GPUFRAG_CONSUMER_PID` traces only the consumer's direct child.

mod preload_common;

use gpufrag_wire::event::EventKind;
use gpufrag_wire::hello::HELLO_F_FORKED;
use preload_common::*;

fn kinds(t: &Traced) -> Vec<(EventKind, u64)> {
    t.events.iter().map(|e| (e.kind().expect("known kind"), e.size)).collect()
}

#[test]
fn fork_child_is_rearmed_and_exec_is_followed() {
    let run = traced_run(&["fork-exec"], &[]);
    assert!(run.output.status.success(), "{}\n{}", run.stdout(), String::from_utf8_lossy(&run.output.stderr));
    assert_eq!(normalized(&run.output.stdout), normalized(&bare_run(&["fork-exec"]).stdout));
    let results = lines_with(&run.stdout(), "RESULT");
    let parent_pid = num(&results[0], "pid") as u32;
    let child_pid = num(&results[1], "pid") as u32;
    let parent_addr = addr(field(&results[0], "addr"));
    let child_addr = addr(field(&results[1], "addr"));
    let exec_addr = addr(field(&results[2], "addr"));

    let by = |pid: u32, forked: bool| {
        let mut m = run.traced.iter().filter(|t| t.hello.pid == pid && (t.hello.flags & HELLO_F_FORKED != 0) == forked);
        let t = m.next().unwrap_or_else(|| panic!("no connection for pid {pid} forked={forked}: {:#?}", run.hellos()));
        assert!(m.next().is_none());
        t
    };
    assert_eq!(run.traced.len(), 3, "parent, fork child, exec'd image: {:#?}", run.hellos());
    let parent = by(parent_pid, false);
    let child = by(child_pid, true);
    let image = by(child_pid, false);
    assert_eq!(parent.hello.ppid, std::process::id());
    assert_eq!(child.hello.ppid, parent_pid);
    assert_eq!(image.hello.ppid, parent_pid);
    assert_eq!(image.hello.start_time, child.hello.start_time, "exec keeps the process");
    assert!(parent.eof && child.eof && image.eof);

    let mib = |n: u64| n * MIB;
    // The parent: 64 MiB, its first-allocation sample, cudaMemGetInfo twice, the free, exit.
    let p = kinds(parent);
    assert_eq!(p[0], (EventKind::MemAlloc, mib(64)));
    assert_eq!(parent.events[0].addr, parent_addr);
    assert_eq!(
        p.iter().map(|k| k.0).collect::<Vec<_>>(),
        [
            EventKind::MemAlloc,
            EventKind::DeviceInfo,
            EventKind::DeviceInfo,
            EventKind::DeviceInfo,
            EventKind::MemFree,
            EventKind::ProcessExit
        ]
    );
    assert!(parent.events.iter().all(|e| e.pid == parent_pid), "the child never wrote the parent's ring");
    // The fork child: 32 MiB, its own first sample, cudaMemGetInfo; then exec (no ProcessExit).
    let c = kinds(child);
    assert_eq!(c.iter().map(|k| k.0).collect::<Vec<_>>(), [EventKind::MemAlloc, EventKind::DeviceInfo, EventKind::DeviceInfo]);
    assert_eq!(c[0].1, mib(32));
    assert_eq!(child.events[0].addr, child_addr);
    assert!(child.events.iter().all(|e| e.pid == child_pid));
    // The exec'd image: `basic 16MiB`.
    let i = kinds(image);
    assert_eq!(
        i.iter().map(|k| k.0).collect::<Vec<_>>(),
        [EventKind::MemAlloc, EventKind::DeviceInfo, EventKind::DeviceInfo, EventKind::MemFree, EventKind::ProcessExit]
    );
    assert_eq!((image.events[0].addr, image.events[0].size), (exec_addr, mib(16)));
    assert_eq!(image.events[3].addr, exec_addr);
}

#[test]
fn no_follow_traces_only_the_direct_child() {
    let me = std::process::id().to_string();
    let run = traced_run(&["fork-exec"], &[("GPUFRAG_NO_FOLLOW", "1"), ("GPUFRAG_CONSUMER_PID", &me)]);
    assert!(run.output.status.success());
    assert_eq!(normalized(&run.output.stdout), normalized(&bare_run(&["fork-exec"]).stdout));
    let t = run.only();
    assert_eq!(t.hello.ppid, std::process::id());
    assert_eq!(t.memory_events().len(), 3, "64 MiB alloc, free, exit: {:#?}", t.events);
}
