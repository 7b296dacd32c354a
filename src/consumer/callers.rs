//! Which file a traced process's caller address lies in (issue 25, item 3): the consumer's side
//! of naming a driver allocation's owner.
//!
//! The shim puts the return address of the outermost tracked call in each driver allocation's
//! event ([`caller_address`]); here it is looked up in the process's executable mappings, read
//! from `/proc/PID/maps` while the process is alive, and the event gets the file's [`Owner`]
//! (`op`, with `F_OWNER_KNOWN`) before it is applied or recorded, so a replay of the record
//! names the same owners. The mappings are read at the process's hello (by the acceptor: a
//! short-lived process may be gone before its events are drained), cached, and read again on a miss (a
//! library `dlopen`ed since), at most once per [`REFRESH_NS`] per process, so that calls from
//! code no file maps (JIT code) cannot make every event read the file. Bounded: at most
//! [`MAX_MAPPINGS`] mappings per process, [`MAX_PROCESSES`] processes (the cache is emptied past
//! it), and a process's entry goes with its exit. An address no mapping holds, or a process gone
//! before its maps were read, is `other`.

use crate::event::{caller_address, Event, EventKind, F_OWNER_KNOWN};
use crate::owner::Owner;
use std::collections::HashMap;

/// The fewest nanoseconds between two reads of one process's maps.
pub const REFRESH_NS: u64 = 50_000_000;
/// The most executable mappings kept per process.
pub const MAX_MAPPINGS: usize = 65_536;
/// The most processes cached.
pub const MAX_PROCESSES: usize = 4096;

#[derive(Default)]
struct Mappings {
    /// (start, end, owner), sorted by start.
    ranges: Vec<(u64, u64, Owner)>,
    read_at_ns: Option<u64>,
}

impl Mappings {
    fn find(&self, addr: u64) -> Option<Owner> {
        let i = self.ranges.partition_point(|r| r.0 <= addr);
        let r = self.ranges.get(i.checked_sub(1)?)?;
        (addr < r.1).then_some(r.2)
    }
}

/// The per-process cache of executable mappings.
#[derive(Default)]
pub struct Callers {
    procs: HashMap<u32, Mappings>,
}

impl Callers {
    /// Names the owner of `e` when it is a driver allocation carrying a caller address; forgets a
    /// process at its exit. `now_ns` rate-limits the reads of its maps.
    pub fn resolve(&mut self, e: &mut Event, now_ns: u64) {
        if e.kind() == Some(EventKind::ProcessExit) {
            self.procs.remove(&e.pid);
            return;
        }
        let addr = caller_address(e);
        if addr == 0 || e.flags & F_OWNER_KNOWN != 0 {
            return;
        }
        let owner = self.owner_of(e.pid, addr, now_ns);
        e.op = owner as u16;
        e.flags |= F_OWNER_KNOWN;
    }

    fn owner_of(&mut self, pid: u32, addr: u64, now_ns: u64) -> Owner {
        if self.procs.len() >= MAX_PROCESSES && !self.procs.contains_key(&pid) {
            self.procs.clear();
        }
        let m = self.procs.entry(pid).or_default();
        if let Some(o) = m.find(addr) {
            return o;
        }
        if m.read_at_ns.is_none_or(|t| now_ns.saturating_sub(t) >= REFRESH_NS) {
            m.read_at_ns = Some(now_ns);
            if let Some(r) = read_maps(pid) {
                m.ranges = r;
            }
        }
        m.find(addr).unwrap_or(Owner::Other)
    }

    /// Takes `pid`'s mappings read at its hello (the consumer's acceptor, while it surely runs).
    pub fn prime(&mut self, pid: u32, ranges: Vec<(u64, u64, Owner)>, now_ns: u64) {
        if self.procs.len() >= MAX_PROCESSES && !self.procs.contains_key(&pid) {
            self.procs.clear();
        }
        self.procs.insert(pid, Mappings { ranges, read_at_ns: Some(now_ns) });
    }
}

/// `pid`'s code mappings from `/proc/PID/maps`; `None` when it cannot be read (gone) or holds
/// no code (a process that has exited but is not reaped yet reads as empty: its mappings as
/// read before are kept).
pub fn read_maps(pid: u32) -> Option<Vec<(u64, u64, Owner)>> {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).ok().map(|t| parse_maps(&t)).filter(|r| !r.is_empty())
}

/// The executable, file-backed mappings of a `/proc/PID/maps` text, each with its file's owner,
/// sorted by start; lines that do not parse are skipped, at most [`MAX_MAPPINGS`] kept.
pub fn parse_maps(text: &str) -> Vec<(u64, u64, Owner)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut f = line.split_ascii_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else { continue };
        let Some(path) = f.nth(3) else { continue };
        if !perms.contains('x') || !path.starts_with('/') {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else { continue };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else { continue };
        out.push((a, b, Owner::of_file(path)));
        if out.len() >= MAX_MAPPINGS {
            break;
        }
    }
    out.sort_unstable_by_key(|r| r.0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_text_gives_executable_files_and_their_owners() {
        let text = "\
7f0000000000-7f0000100000 r-xp 00000000 08:01 12 /usr/lib/libcublasLt.so.12\n\
7f0000100000-7f0000200000 r--p 00100000 08:01 12 /usr/lib/libcublasLt.so.12\n\
7f1000000000-7f1000001000 r-xp 00000000 08:01 13 /opt/nccl/libnccl.so.2\n\
7f2000000000-7f2000001000 rwxp 00000000 00:00 0 \n\
garbage line\n\
55000000-55001000 r-xp 00000000 08:01 14 /usr/bin/python3 (deleted)\n";
        let r = parse_maps(text);
        assert_eq!(
            r,
            vec![
                (0x5500_0000, 0x5500_1000, Owner::Other),
                (0x7f00_0000_0000, 0x7f00_0010_0000, Owner::Cublas),
                (0x7f10_0000_0000, 0x7f10_0000_1000, Owner::Nccl)
            ]
        );
        let m = Mappings { ranges: r, read_at_ns: Some(0) };
        assert_eq!(m.find(0x7f00_0000_0fff), Some(Owner::Cublas));
        assert_eq!(m.find(0x7f00_0010_0000), None, "the read-only part is no code");
        assert_eq!(m.find(0x1000), None);
    }

    #[test]
    fn this_process_calls_are_resolved_and_unknown_addresses_are_other() {
        let mut c = Callers::default();
        let here = this_process_calls_are_resolved_and_unknown_addresses_are_other as *const () as usize as u64;
        let mut e = Event { handle: here, ..Event::new(EventKind::MemAlloc, std::process::id(), 0) };
        c.resolve(&mut e, 1);
        assert_eq!(e.owner(), Some(Owner::Other), "the test binary is no known library");
        let mut e = Event { handle: 8, ..Event::new(EventKind::MemAlloc, std::process::id(), 0) };
        c.resolve(&mut e, 2);
        assert_eq!(e.owner(), Some(Owner::Other));
        let mut e = Event { handle: 8, ..Event::new(EventKind::BlockAlloc, std::process::id(), 0) };
        c.resolve(&mut e, 3);
        assert_eq!(e.owner(), None, "only driver allocations carry a caller");
    }
}
