//! The address map (`gpufrag::map::AddressSpace`) against a naive model (`tests/common/naive.rs`):
//! random sequences of driver, VMM, pool and block operations applied to both, every figure, the
//! segment list, the block list and the free runs compared after every step (sled's
//! `tests/tree`, proptest's state-machine habit). Addresses come from a window of a few dozen
//! 2 MiB slots so that operations collide, as in redb's fuzz targets: frees of live things, blocks
//! placed in free runs, mappings that touch, overlap and cut each other. Minimised failures are
//! kept below as named regression tests with a one-line postmortem.
//!
//! A second property drives the same operations as wire events through `ingest::State::apply`
//! and through the model's own reading of each event kind (`naive::MEANINGS`, written from the
//! kinds' docs in `wire/src/event.rs`, which a test checks it quotes word for word), to check the
//! event → map wiring (kinds, `F_FRAMEWORK_OWNED`, `F_BLOCK_SIZE_KNOWN`, failed calls, adopt):
//! wiring `MemAllocPitch` to a plain driver segment in `State::apply` fails it at the first
//! event, a 512-byte pitch allocation (map: `kind: Driver`, model: `kind: Pitch`). A replay of
//! the `gpt2_varlen` trace checks both on a real PyTorch run.

#[path = "common/naive.rs"]
mod naive;

use gpufrag::alloc::pytorch::{AllocatorRules, ROUNDUP_INTERVALS};
use gpufrag::event::{Event, EventKind, F_BLOCK_SIZE_KNOWN, F_FRAMEWORK_OWNED};
use gpufrag::ingest::State;
use gpufrag::map::{AddressSpace, Anomaly, SegmentKind};
use naive::{NaiveSpace, NaiveState};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const BASE: u64 = 0x7f00_0000_0000;
const MIB: u64 = 1 << 20;
const PAGE: u64 = 2 * MIB;
/// 2 MiB slots in the window: few enough that operations collide.
const SLOTS: u64 = 32;

/// Which address an operation acts on: the n-th live thing of the right sort (modulo how many
/// there are; `part` places a block that many quarters into a free run), or a raw spot.
#[derive(Clone, Copy, Debug)]
enum Pick {
    Live { n: usize, part: u64 },
    Raw { slot: u64, off: u64 },
}

/// An operation as generated; [`Op::resolve`] turns it into a concrete [`Step`] against the model.
#[derive(Clone, Copy, Debug)]
enum Op {
    DriverAlloc { slot: u64, off: u64, size: u64, kind: SegmentKind, framework: bool, stream: u64 },
    DriverFree { pick: Pick },
    Reserve { slot: u64, pages: u64 },
    ReserveFree { pick: Pick },
    PhysCreate { handle: u64, pages: u64 },
    PhysRelease { handle: u64 },
    Map { slot: u64, pages: u64, framework: bool },
    Unmap { pick: Pick, pages: u64 },
    PoolAlloc { slot: u64, off: u64, size: u64, pool: u64, stream: u64 },
    PoolFree { pick: Pick },
    PoolTrim { pool: u64, keep: u64 },
    PoolReserved { pool: u64, reserved: u64 },
    BlockAlloc { pick: Pick, requested: u64, known: Option<u64> },
    BlockFree { pick: Pick },
    Adopt { pick: Pick },
}

/// One concrete operation; `at` is an offset from [`BASE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    DriverAlloc { at: u64, size: u64, kind: SegmentKind, framework: bool, stream: u64 },
    DriverFree { at: u64 },
    Reserve { at: u64, size: u64 },
    ReserveFree { at: u64 },
    PhysCreate { handle: u64, size: u64 },
    PhysRelease { handle: u64 },
    Map { at: u64, size: u64, framework: bool },
    Unmap { at: u64, size: u64 },
    PoolAlloc { at: u64, size: u64, pool: u64, stream: u64 },
    PoolFree { at: u64 },
    PoolTrim { pool: u64, keep: u64 },
    PoolReserved { pool: u64, reserved: u64 },
    BlockAlloc { at: u64, requested: u64, known: Option<u64> },
    BlockFree { at: u64 },
    Adopt { at: u64 },
}

fn raw(slot: u64, off: u64) -> u64 {
    slot * PAGE + off * 512
}

fn nth<T: Clone>(v: &[T], n: usize) -> Option<T> {
    (!v.is_empty()).then(|| v[n % v.len()].clone())
}

impl Op {
    fn resolve(self, m: &NaiveSpace) -> Step {
        let segment_at = |pick: Pick| match pick {
            Pick::Live { n, .. } => nth(&m.segment_list(), n).map_or(0, |s| s.start - BASE),
            Pick::Raw { slot, off } => raw(slot, off),
        };
        match self {
            Op::DriverAlloc { slot, off, size, kind, framework, stream } => {
                Step::DriverAlloc { at: raw(slot, off), size, kind, framework, stream }
            }
            Op::DriverFree { pick } => Step::DriverFree { at: segment_at(pick) },
            Op::Reserve { slot, pages } => Step::Reserve { at: raw(slot, 0), size: pages * PAGE },
            Op::ReserveFree { pick } => {
                let mut r: Vec<u64> = m.reservations.iter().map(|&(s, _)| s - BASE).collect();
                r.sort();
                let at = match pick {
                    Pick::Live { n, .. } => nth(&r, n).unwrap_or(0),
                    Pick::Raw { slot, .. } => raw(slot, 0),
                };
                Step::ReserveFree { at }
            }
            Op::PhysCreate { handle, pages } => Step::PhysCreate { handle, size: pages * PAGE },
            Op::PhysRelease { handle } => Step::PhysRelease { handle },
            Op::Map { slot, pages, framework } => Step::Map { at: raw(slot, 0), size: pages * PAGE, framework },
            Op::Unmap { pick, pages } => {
                // Mostly a page-aligned piece of a mapped segment: its start, middle or end.
                let at = match pick {
                    Pick::Live { n, part } => {
                        let mapped: Vec<_> = m.segment_list().into_iter().filter(|s| s.kind == SegmentKind::Mapped).collect();
                        nth(&mapped, n).map_or(0, |s| s.start - BASE + s.size / PAGE * part / 4 * PAGE)
                    }
                    Pick::Raw { slot, .. } => raw(slot, 0),
                };
                Step::Unmap { at, size: pages * PAGE }
            }
            Op::PoolAlloc { slot, off, size, pool, stream } => Step::PoolAlloc { at: raw(slot, off), size, pool, stream },
            Op::PoolFree { pick } => Step::PoolFree { at: segment_at(pick) },
            Op::PoolTrim { pool, keep } => Step::PoolTrim { pool, keep },
            Op::PoolReserved { pool, reserved } => Step::PoolReserved { pool, reserved },
            Op::BlockAlloc { pick, requested, known } => {
                let at = match pick {
                    Pick::Live { n, part } => match nth(&m.free_runs(), n) {
                        Some((s, l)) => s - BASE + (l * part / 4) / 512 * 512,
                        None => segment_at(pick),
                    },
                    Pick::Raw { slot, off } => raw(slot, off),
                };
                Step::BlockAlloc { at, requested, known }
            }
            Op::BlockFree { pick } => {
                let at = match pick {
                    Pick::Live { n, .. } => nth(&m.block_list(), n).map_or(0, |b| b.addr - BASE),
                    Pick::Raw { slot, off } => raw(slot, off),
                };
                Step::BlockFree { at }
            }
            Op::Adopt { pick } => Step::Adopt { at: segment_at(pick) },
        }
    }
}

/// What an operation returned: `Ok(size)` for block operations, `Ok(0)` for the rest.
type Outcome = Result<u64, Anomaly>;

impl Step {
    fn apply_real(self, m: &mut AddressSpace) -> Outcome {
        let ok = |r: Result<(), Anomaly>| r.map(|()| 0);
        match self {
            Step::DriverAlloc { at, size, kind, framework, stream } => {
                ok(m.driver_alloc(BASE.wrapping_add(at), size, kind, framework, stream))
            }
            Step::DriverFree { at } => ok(m.driver_free(BASE.wrapping_add(at))),
            Step::Reserve { at, size } => ok(m.reserve(BASE.wrapping_add(at), size)),
            Step::ReserveFree { at } => ok(m.reserve_free(BASE.wrapping_add(at))),
            Step::PhysCreate { handle, size } => {
                m.phys_create(handle, size);
                Ok(0)
            }
            Step::PhysRelease { handle } => ok(m.phys_release(handle)),
            Step::Map { at, size, framework } => ok(m.map(BASE.wrapping_add(at), size, framework)),
            Step::Unmap { at, size } => ok(m.unmap(BASE.wrapping_add(at), size)),
            Step::PoolAlloc { at, size, pool, stream } => ok(m.pool_alloc(BASE.wrapping_add(at), size, pool, stream)),
            Step::PoolFree { at } => ok(m.pool_free(BASE.wrapping_add(at))),
            Step::PoolTrim { pool, keep } => {
                m.pool_trim(pool, keep);
                Ok(0)
            }
            Step::PoolReserved { pool, reserved } => {
                m.pool_reserved(pool, reserved);
                Ok(0)
            }
            Step::BlockAlloc { at, requested, known } => m.block_alloc(BASE.wrapping_add(at), requested, known),
            Step::BlockFree { at } => m.block_free(BASE.wrapping_add(at)).map(|b| b.size),
            Step::Adopt { at } => ok(m.adopt_at(BASE.wrapping_add(at))),
        }
    }

    fn apply_model(self, m: &mut NaiveSpace) -> Outcome {
        let ok = |r: Result<(), Anomaly>| r.map(|()| 0);
        match self {
            Step::DriverAlloc { at, size, kind, framework, stream } => {
                ok(m.driver_alloc(BASE.wrapping_add(at), size, kind, framework, stream))
            }
            Step::DriverFree { at } => ok(m.driver_free(BASE.wrapping_add(at))),
            Step::Reserve { at, size } => ok(m.reserve(BASE.wrapping_add(at), size)),
            Step::ReserveFree { at } => ok(m.reserve_free(BASE.wrapping_add(at))),
            Step::PhysCreate { handle, size } => {
                m.phys_create(handle, size);
                Ok(0)
            }
            Step::PhysRelease { handle } => ok(m.phys_release(handle)),
            Step::Map { at, size, framework } => ok(m.map(BASE.wrapping_add(at), size, framework, true)),
            Step::Unmap { at, size } => ok(m.unmap(BASE.wrapping_add(at), size)),
            Step::PoolAlloc { at, size, pool, stream } => ok(m.pool_alloc(BASE.wrapping_add(at), size, pool, stream)),
            Step::PoolFree { at } => ok(m.pool_free(BASE.wrapping_add(at))),
            Step::PoolTrim { pool, keep } => {
                m.pool_trim(pool, keep);
                Ok(0)
            }
            Step::PoolReserved { pool, reserved } => {
                m.pool_reserved(pool, reserved);
                Ok(0)
            }
            Step::BlockAlloc { at, requested, known } => m.block_alloc(BASE.wrapping_add(at), requested, known),
            Step::BlockFree { at } => m.block_free(BASE.wrapping_add(at)).map(|b| b.size),
            Step::Adopt { at } => ok(m.adopt_at(BASE.wrapping_add(at))),
        }
    }

    /// The wire event a source would send for this step.
    fn event(self) -> Event {
        let e = |kind| Event::new(kind, PID, DEVICE);
        let owned = |framework: bool| if framework { F_FRAMEWORK_OWNED } else { 0 };
        match self {
            Step::DriverAlloc { at, size, kind, framework, stream } => {
                let kind = match kind {
                    SegmentKind::Driver => EventKind::MemAlloc,
                    SegmentKind::Pitch => EventKind::MemAllocPitch,
                    SegmentKind::Managed => EventKind::MemAllocManaged,
                    other => unreachable!("driver_alloc is never generated with {other:?}"),
                };
                Event { addr: BASE.wrapping_add(at), size, stream, flags: owned(framework), ..e(kind) }
            }
            Step::DriverFree { at } => Event { addr: BASE.wrapping_add(at), ..e(EventKind::MemFree) },
            Step::Reserve { at, size } => Event { addr: BASE.wrapping_add(at), size, ..e(EventKind::AddressReserve) },
            Step::ReserveFree { at } => Event { addr: BASE.wrapping_add(at), ..e(EventKind::AddressFree) },
            Step::PhysCreate { handle, size } => Event { handle, size, ..e(EventKind::PhysCreate) },
            Step::PhysRelease { handle } => Event { handle, ..e(EventKind::PhysRelease) },
            Step::Map { at, size, framework } => Event { addr: BASE.wrapping_add(at), size, flags: owned(framework), ..e(EventKind::Map) },
            Step::Unmap { at, size } => Event { addr: BASE.wrapping_add(at), size, ..e(EventKind::Unmap) },
            Step::PoolAlloc { at, size, pool, stream } => {
                Event { addr: BASE.wrapping_add(at), size, handle: pool, stream, ..e(EventKind::PoolAlloc) }
            }
            Step::PoolFree { at } => Event { addr: BASE.wrapping_add(at), ..e(EventKind::PoolFree) },
            Step::PoolTrim { pool, keep } => Event { handle: pool, size: keep, ..e(EventKind::PoolTrim) },
            Step::PoolReserved { pool, reserved } => Event { handle: pool, size: reserved, ..e(EventKind::PoolReserved) },
            Step::BlockAlloc { at, requested, known } => Event {
                addr: BASE.wrapping_add(at),
                requested,
                size: known.unwrap_or(0),
                flags: if known.is_some() { F_BLOCK_SIZE_KNOWN } else { 0 },
                ..e(EventKind::BlockAlloc)
            },
            Step::BlockFree { at } => Event { addr: BASE.wrapping_add(at), ..e(EventKind::BlockFree) },
            Step::Adopt { at } => Event { addr: BASE.wrapping_add(at), ..e(EventKind::Adopt) },
        }
    }
}

const PID: u32 = 4242;
const DEVICE: i16 = 1;

/// Every figure, the segment list, the block list and the free runs of the map equal the model's.
fn same_state(real: &AddressSpace, model: &NaiveSpace, context: &dyn Fn() -> String) -> Result<(), TestCaseError> {
    let (rf, mf) = (real.figures(), model.figures());
    prop_assert_eq!(rf, mf, "figures (left: map, right: model)\n{}", context());
    let segments: Vec<_> = real.segments().cloned().collect();
    prop_assert_eq!(segments, model.segment_list(), "segments (left: map, right: model)\n{}", context());
    let blocks: Vec<_> = real.blocks().copied().collect();
    prop_assert_eq!(blocks, model.block_list(), "blocks (left: map, right: model)\n{}", context());
    let runs: Vec<_> = real.free_runs().collect();
    prop_assert_eq!(runs, model.free_runs(), "free runs (left: map, right: model)\n{}", context());
    prop_assert_eq!(real.largest_free_run(), rf.largest_free_block);
    Ok(())
}

/// Both sides agree on what the step returned. For an unmap the map reports one of possibly
/// several anomalies, so only "anomaly or not" is compared there; everywhere else the exact
/// anomaly (or block size) must match.
fn same_outcome(step: Step, real: &Outcome, model: &Outcome, context: &dyn Fn() -> String) -> Result<(), TestCaseError> {
    if matches!(step, Step::Unmap { .. }) {
        prop_assert_eq!(real.is_err(), model.is_err(), "unmap verdict: map {:?}, model {:?}\n{}", real, model, context());
    } else {
        prop_assert_eq!(real, model, "outcome (left: map, right: model)\n{}", context());
    }
    Ok(())
}

fn describe(steps: &[Step], rules: &AllocatorRules) -> String {
    let mut s = format!("rules: max_split_size {}, divisions {:?}\n", rules.max_split_size, rules.roundup_power2_divisions[0]);
    for (i, st) in steps.iter().enumerate() {
        s += &format!("  {i:3}: {st:?}\n");
    }
    s
}

/// Applies `ops` to a fresh map and a fresh model, comparing after every step.
fn run_ops(ops: &[Op], rules: &AllocatorRules) -> Result<(), TestCaseError> {
    let (real, model) = (AddressSpace::new(rules.clone()), NaiveSpace::new(rules.clone()));
    compare_steps(real, model, ops, rules, |op, m| op.resolve(m))
}

/// Resolves each operation against the model, applies the step to both sides and compares them
/// after every step.
fn compare_steps<O: Copy>(
    mut real: AddressSpace,
    mut model: NaiveSpace,
    ops: &[O],
    rules: &AllocatorRules,
    resolve: impl Fn(O, &NaiveSpace) -> Step,
) -> Result<(), TestCaseError> {
    let mut done = Vec::with_capacity(ops.len());
    for &op in ops {
        let step = resolve(op, &model);
        done.push(step);
        let context = || format!("after step {}: {step:?}\n{}", done.len() - 1, describe(&done, rules));
        let r = step.apply_real(&mut real);
        let m = step.apply_model(&mut model);
        same_outcome(step, &r, &m, &context)?;
        same_state(&real, &model, &context)?;
        if let Err(e) = real.check_invariants() {
            return Err(TestCaseError::fail(format!("invariant: {e}\n{}", context())));
        }
    }
    Ok(())
}

/// Applies concrete steps (a kept counterexample) to both sides.
fn run_steps(steps: &[Step]) {
    let rules = AllocatorRules::default();
    let mut real = AddressSpace::new(rules.clone());
    let mut model = NaiveSpace::new(rules.clone());
    for (i, &step) in steps.iter().enumerate() {
        let context = || format!("after step {i}: {step:?}\n{}", describe(&steps[..=i], &rules));
        let r = step.apply_real(&mut real);
        let m = step.apply_model(&mut model);
        let checked = same_outcome(step, &r, &m, &context)
            .and_then(|()| same_state(&real, &model, &context))
            .and_then(|()| real.check_invariants().map_err(|e| TestCaseError::fail(format!("invariant: {e}\n{}", context()))));
        if let Err(e) = checked {
            panic!("{e}");
        }
    }
}

/// The same steps as wire events, through `State::apply` and through the model's own reading
/// of the wire format ([`NaiveState::apply`], its table written from the kinds' docs), each
/// preceded by a copy that failed (`rc != 0`), which must change nothing. A kind wired to the
/// wrong map operation in the state differs from the model here.
fn run_events(ops: &[Op], rules: &AllocatorRules) -> Result<(), TestCaseError> {
    let mut state = State::new(rules.clone());
    let mut model = NaiveState::new(rules.clone());
    let mut done = Vec::with_capacity(ops.len());
    for op in ops {
        let step = op.resolve(model.space(PID, DEVICE));
        done.push(step);
        let context = || format!("after event {}: {step:?}\n{}", done.len() - 1, describe(&done, rules));
        let ev = step.event();
        for e in [Event { rc: 2, ..ev }, ev] {
            state.apply(&e);
            model.apply(&e);
        }
        prop_assert_eq!(state.anomaly_count, model.anomalies, "anomalies counted\n{}", context());
        let real = &state.spaces[&(PID, DEVICE)].map;
        same_state(real, model.space(PID, DEVICE), &context)?;
    }
    prop_assert_eq!(state.spaces.len(), 1);
    Ok(())
}

fn slot() -> impl Strategy<Value = u64> {
    0..SLOTS
}

/// 512-byte steps into a slot: mostly its start, sometimes anywhere in its first page.
fn off() -> impl Strategy<Value = u64> {
    prop_oneof![3 => Just(0u64), 1 => 0..4096u64]
}

/// Segment sizes: sub-2 MiB (512-byte multiples), whole pages, or anything up to 8 MiB.
fn segment_size() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => (1..=4096u64).prop_map(|n| n * 512),
        2 => (1..=4u64).prop_map(|n| n * PAGE),
        1 => (1..=16384u64).prop_map(|n| n * 512),
    ]
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        4 => (any::<usize>(), prop_oneof![3 => Just(0u64), 1 => 1..4u64]).prop_map(|(n, part)| Pick::Live { n, part }),
        1 => (slot(), off()).prop_map(|(slot, off)| Pick::Raw { slot, off }),
    ]
}

/// Requested sizes: small-pool (mostly), around the 1 MiB pool boundary, large, whole MiBs.
fn requested() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 0..=64 * 1024u64, 3 => 0..=MIB + 4096, 2 => 0..=8 * MIB, 1 => (1..=8u64).prop_map(|n| n * MIB)]
}

/// A known block extent (0 included: an anomaly), mostly up to 1 MiB.
fn known() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![6 => Just(None), 2 => (0..=2048u64).prop_map(|n| Some(n * 512)), 1 => (0..=16384u64).prop_map(|n| Some(n * 512))]
}

/// One operation; `blocks` weighs block operations against segment ones (high: segments live
/// long enough to fill with blocks, so that splits, swallowed remainders and merges happen).
fn op(blocks: u32) -> impl Strategy<Value = Op> {
    let kind = prop_oneof![4 => Just(SegmentKind::Driver), 1 => Just(SegmentKind::Pitch), 1 => Just(SegmentKind::Managed)];
    prop_oneof![
        6 => (slot(), off(), segment_size(), kind, any::<bool>(), 0..3u64)
            .prop_map(|(slot, off, size, kind, framework, stream)| Op::DriverAlloc { slot, off, size, kind, framework, stream }),
        3 => pick().prop_map(|pick| Op::DriverFree { pick }),
        1 => (slot(), 1..=8u64).prop_map(|(slot, pages)| Op::Reserve { slot, pages }),
        1 => pick().prop_map(|pick| Op::ReserveFree { pick }),
        1 => (1..=4u64, 1..=4u64).prop_map(|(handle, pages)| Op::PhysCreate { handle, pages }),
        1 => (1..=4u64).prop_map(|handle| Op::PhysRelease { handle }),
        3 => (slot(), 1..=4u64, any::<bool>()).prop_map(|(slot, pages, framework)| Op::Map { slot, pages, framework }),
        2 => (pick(), 1..=4u64).prop_map(|(pick, pages)| Op::Unmap { pick, pages }),
        2 => (slot(), off(), segment_size(), 1..=3u64, 0..3u64)
            .prop_map(|(slot, off, size, pool, stream)| Op::PoolAlloc { slot, off, size, pool, stream }),
        2 => pick().prop_map(|pick| Op::PoolFree { pick }),
        1 => (1..=3u64, 0..=8u64).prop_map(|(pool, n)| Op::PoolTrim { pool, keep: n * MIB }),
        1 => (1..=3u64, 0..=16u64).prop_map(|(pool, n)| Op::PoolReserved { pool, reserved: n * MIB }),
        10 * blocks => (pick(), requested(), known()).prop_map(|(pick, requested, known)| Op::BlockAlloc { pick, requested, known }),
        6 * blocks => pick().prop_map(|pick| Op::BlockFree { pick }),
        1 => pick().prop_map(|pick| Op::Adopt { pick }),
    ]
}

/// 1 to 200 operations, mixed evenly or heavy on blocks.
fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop_oneof![prop::collection::vec(op(1), 1..200), prop::collection::vec(op(6), 1..200)]
}

/// Default rules, a max_split_size (big blocks never split), and power-of-two divisions.
fn rules() -> impl Strategy<Value = AllocatorRules> {
    prop_oneof![
        2 => Just(AllocatorRules::default()),
        1 => Just(AllocatorRules { max_split_size: 4 * MIB, ..AllocatorRules::default() }),
        1 => Just(AllocatorRules { roundup_power2_divisions: [4; ROUNDUP_INTERVALS], ..AllocatorRules::default() }),
    ]
}

/// One operation on a single expandable segment (a reserved range of [`SLOTS`] pages, mapped and
/// unmapped page by page, blocks placed at the start of free runs as caching allocators do):
/// dense enough that unmaps part segments with live blocks on both sides and maps join them.
#[derive(Clone, Copy, Debug)]
enum ExpOp {
    Map {
        page: u64,
        pages: u64,
    },
    /// Unmap whole pages inside the n-th free run (or at `page` when none fits).
    UnmapFree {
        n: usize,
        page: u64,
        pages: u64,
    },
    Alloc {
        n: usize,
        requested: u64,
        known: Option<u64>,
    },
    Free {
        n: usize,
    },
}

impl ExpOp {
    fn resolve(self, m: &NaiveSpace) -> Step {
        match self {
            ExpOp::Map { page, pages } => Step::Map { at: page * PAGE, size: pages * PAGE, framework: true },
            ExpOp::UnmapFree { n, page, pages } => {
                let fits: Vec<(u64, u64)> = m
                    .free_runs()
                    .into_iter()
                    .filter_map(|(s, l)| {
                        let lo = (s - BASE).next_multiple_of(PAGE);
                        let hi = (s - BASE + l) / PAGE * PAGE;
                        (hi > lo).then_some((lo, hi))
                    })
                    .collect();
                match nth(&fits, n) {
                    Some((lo, hi)) => Step::Unmap { at: lo, size: (pages * PAGE).min(hi - lo) },
                    None => Step::Unmap { at: page * PAGE, size: pages * PAGE },
                }
            }
            ExpOp::Alloc { n, requested, known } => {
                let at = nth(&m.free_runs(), n).map_or(0, |(s, _)| s - BASE);
                Step::BlockAlloc { at, requested, known }
            }
            ExpOp::Free { n } => Step::BlockFree { at: nth(&m.block_list(), n).map_or(0, |b| b.addr - BASE) },
        }
    }
}

fn exp_ops() -> impl Strategy<Value = Vec<ExpOp>> {
    let op = prop_oneof![
        2 => (0..SLOTS, 1..=6u64).prop_map(|(page, pages)| ExpOp::Map { page, pages }),
        2 => (any::<usize>(), 0..SLOTS, 1..=3u64).prop_map(|(n, page, pages)| ExpOp::UnmapFree { n, page, pages }),
        6 => (any::<usize>(), requested(), known()).prop_map(|(n, requested, known)| ExpOp::Alloc { n, requested, known }),
        3 => any::<usize>().prop_map(|n| ExpOp::Free { n }),
    ];
    prop::collection::vec(op, 1..300)
}

/// Applies expandable-segment operations to a map and a model that both start with the
/// reserved range, comparing after every step.
fn run_exp_ops(ops: &[ExpOp], rules: &AllocatorRules) -> Result<(), TestCaseError> {
    let mut real = AddressSpace::new(rules.clone());
    let mut model = NaiveSpace::new(rules.clone());
    real.reserve(BASE, SLOTS * PAGE).map_err(|e| TestCaseError::fail(format!("reserve: {e:?}")))?;
    model.reserve(BASE, SLOTS * PAGE).map_err(|e| TestCaseError::fail(format!("model reserve: {e:?}")))?;
    compare_steps(real, model, ops, rules, |op, m| op.resolve(m))
}

/// `cases` cases unless `PROPTEST_CASES` says otherwise (a long soak: `PROPTEST_CASES=100000
/// cargo test --release --test map_model`); failures are kept as named tests below, not in a file.
fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(cases);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn the_map_agrees_with_the_naive_model_after_every_step(rules in rules(), ops in ops()) {
        run_ops(&ops, &rules)?;
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn expandable_segments_cut_and_join_as_the_model_says(rules in rules(), ops in exp_ops()) {
        run_exp_ops(&ops, &rules)?;
    }
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn events_through_ingest_reach_the_map_as_the_model_says(rules in rules(), ops in ops()) {
        run_events(&ops, &rules)?;
    }
}

/// Offsets from [`BASE`] that hostile steps act on: a few colliding spots at the bottom of the
/// window and a few whose absolute address lies within 8 MiB of 2^64.
fn hostile_at() -> impl Strategy<Value = u64> {
    let top = u64::MAX - BASE + 1; // BASE.wrapping_add(top) == 0
    prop_oneof![
        3 => (0..4u64).prop_map(|n| n * PAGE),
        1 => (0..4u64).prop_map(|n| n * 512),
        2 => (1..=4u64).prop_map(move |n| top - n * PAGE),
    ]
}

/// Sizes that hostile inputs carry: zero, tiny, a page or two, and ones that wrap past 2^64.
fn hostile_size() -> impl Strategy<Value = u64> {
    prop_oneof![3 => Just(0u64), 2 => Just(512u64), 2 => (1..=3u64).prop_map(|n| n * PAGE), 1 => Just(u64::MAX), 1 => Just(u64::MAX / 2)]
}

/// Concrete steps on a handful of addresses with zero sizes, overlaps, repeats and wrap-around:
/// what corrupt or hostile event streams carry.
fn hostile_step() -> impl Strategy<Value = Step> {
    let kind = prop_oneof![Just(SegmentKind::Driver), Just(SegmentKind::Pitch)];
    prop_oneof![
        3 => (hostile_at(), hostile_size(), kind, any::<bool>()).prop_map(|(at, size, kind, framework)| Step::DriverAlloc { at, size, kind, framework, stream: 0 }),
        2 => hostile_at().prop_map(|at| Step::DriverFree { at }),
        1 => (hostile_at(), hostile_size()).prop_map(|(at, size)| Step::Reserve { at, size }),
        1 => hostile_at().prop_map(|at| Step::ReserveFree { at }),
        3 => (hostile_at(), hostile_size(), any::<bool>()).prop_map(|(at, size, framework)| Step::Map { at, size, framework }),
        3 => (hostile_at(), hostile_size()).prop_map(|(at, size)| Step::Unmap { at, size }),
        1 => (hostile_at(), hostile_size(), 1..=2u64).prop_map(|(at, size, pool)| Step::PoolAlloc { at, size, pool, stream: 0 }),
        1 => hostile_at().prop_map(|at| Step::PoolFree { at }),
        1 => (1..=2u64, 0..=4 * PAGE).prop_map(|(pool, reserved)| Step::PoolReserved { pool, reserved }),
        4 => (hostile_at(), prop_oneof![Just(0u64), Just(512u64), Just(PAGE), Just(u64::MAX)], prop_oneof![Just(None), Just(Some(512u64)), Just(Some(PAGE)), Just(Some(u64::MAX))])
            .prop_map(|(at, requested, known)| Step::BlockAlloc { at, requested, known }),
        3 => hostile_at().prop_map(|at| Step::BlockFree { at }),
    ]
}

proptest! {
    #![proptest_config(config(512))]

    /// Every loop of the map terminates and every invariant holds on hostile steps (the test
    /// itself would hang or panic otherwise), and the map still agrees with the model.
    #[test]
    fn hostile_zero_size_overlapping_and_wrapping_steps_terminate_and_keep_the_invariants(steps in prop::collection::vec(hostile_step(), 1..120)) {
        let rules = AllocatorRules::default();
        compare_steps(AddressSpace::new(rules.clone()), NaiveSpace::new(rules.clone()), &steps, &rules, |s, _| s)?;
    }
}

#[test]
fn event_flags_choose_kind_ownership_and_block_extent() {
    let mut state = State::default();
    let ev = |kind, addr: u64, size: u64, flags: u32| Event { addr: BASE + addr, size, flags, ..Event::new(kind, PID, DEVICE) };
    state.apply(&ev(EventKind::MemAlloc, 0, 20 * MIB, F_FRAMEWORK_OWNED));
    state.apply(&ev(EventKind::MemAlloc, 20 * MIB, 4 * MIB, 0));
    state.apply(&ev(EventKind::MemAllocPitch, 24 * MIB, MIB, 0));
    state.apply(&ev(EventKind::MemAllocManaged, 26 * MIB, MIB, 0));
    state.apply(&Event { handle: 3, ..ev(EventKind::PoolAlloc, 28 * MIB, 2 * MIB, 0) });
    let m = &state.spaces[&(PID, DEVICE)].map;
    let kinds: Vec<(SegmentKind, bool, u64)> = m.segments().map(|s| (s.kind, s.framework, s.owner)).collect();
    assert_eq!(
        kinds,
        vec![
            (SegmentKind::Driver, true, 0),
            (SegmentKind::Driver, false, 0),
            (SegmentKind::Pitch, false, 0),
            (SegmentKind::Managed, false, 0),
            (SegmentKind::Pool, false, 3),
        ]
    );
    let f = m.figures();
    // Allocated: what the caches hand out (no block yet, the live pool allocation), not the raw
    // driver memory.
    assert_eq!((f.releasable, f.allocated, f.page_stranded), (20 * MIB, 2 * MIB, MIB), "only the pitch allocation shares a page");
    // Outside the cache: the raw driver, pitch and managed segments; the pool allocation is cache.
    assert_eq!((f.non_framework, f.framework_reserved), (6 * MIB, 22 * MIB));

    // Without F_BLOCK_SIZE_KNOWN the rules decide the extent: 3 MiB + 1 rounds to 512 bytes.
    state.apply(&Event { requested: 3 * MIB + 1, ..ev(EventKind::BlockAlloc, 0, 0, 0) });
    // With it the size is taken as given, whatever was requested.
    state.apply(&Event { requested: 1, ..ev(EventKind::BlockAlloc, 8 * MIB, 4 * MIB, F_BLOCK_SIZE_KNOWN) });
    // A raw segment is adopted by the first block placed in it.
    state.apply(&Event { requested: MIB, ..ev(EventKind::BlockAlloc, 20 * MIB, 0, 0) });
    let m = &state.spaces[&(PID, DEVICE)].map;
    let blocks: Vec<(u64, u64, u64)> = m.blocks().map(|b| (b.addr - BASE, b.size, b.requested)).collect();
    assert_eq!(blocks, vec![(0, 3 * MIB + 512, 3 * MIB + 1), (8 * MIB, 4 * MIB, 1), (20 * MIB, MIB, MIB)]);
    assert!(m.segments().nth(1).is_some_and(|s| s.framework));
    assert!(state.exact(), "{:?}", state.anomalies);

    // A failed call changes nothing; a free of what is not there is an anomaly, counted.
    let before = state.spaces[&(PID, DEVICE)].map.figures();
    state.apply(&Event { rc: 2, ..ev(EventKind::MemFree, 0, 0, 0) });
    assert_eq!(state.spaces[&(PID, DEVICE)].map.figures(), before);
    state.apply(&ev(EventKind::BlockFree, 5 * MIB, 0, 0));
    assert_eq!(state.anomaly_count, 1);
    assert_eq!(state.anomalies[0].anomaly, Anomaly::FreeUnknown(BASE + 5 * MIB));
}

#[test]
fn gpt2_varlen_replay_agrees_with_the_model() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2_varlen.pickle.gz");
    let snap = gpufrag::snapshot::load(&path).expect("load gpt2_varlen");
    let (events, rules) = (snap.events(), gpufrag::input::rules_from(&snap.settings));
    assert!(events.len() > 25_000, "{} events", events.len());
    let mut state = State::new(rules.clone());
    let mut model = NaiveState::new(rules);
    for (i, ev) in events.iter().enumerate() {
        state.apply(ev);
        model.apply(ev);
        // The model recomputes everything from scratch: compare often, not after every event.
        if i % 97 != 0 && i + 1 != events.len() {
            continue;
        }
        let real = &state.spaces[&(ev.pid, ev.device)].map;
        let naive = model.space(ev.pid, ev.device);
        assert_eq!(real.figures(), naive.figures(), "event {i}: {ev:?}");
        if i % 997 == 0 || i + 1 == events.len() {
            assert!(real.segments().cloned().eq(naive.segment_list()), "segments at event {i}");
            assert!(real.blocks().copied().eq(naive.block_list()), "blocks at event {i}");
            assert!(real.free_runs().eq(naive.free_runs()), "free runs at event {i}");
        }
    }
    assert_eq!(state.anomaly_count, model.anomalies, "{:?}", state.anomalies);
}

/// The model's event table is written from the wire format's own words: it names every kind
/// once, and the doc it quotes for each is word for word the kind's doc comment in
/// `wire/src/event.rs` (a changed doc makes this fail, so the meaning is read again).
#[test]
fn the_models_event_table_covers_every_kind_and_quotes_the_wire_docs() {
    let src =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("wire/src/event.rs")).expect("wire/src/event.rs");
    let body = &src[src.find("pub enum EventKind {").expect("the enum")..src.find("impl EventKind").expect("its impl")];
    let mut docs = std::collections::BTreeMap::new();
    let mut doc: Vec<&str> = Vec::new();
    for line in body.lines().skip(1).map(str::trim) {
        if let Some(d) = line.strip_prefix("///") {
            doc.push(d.trim());
        } else if let Some((name, _)) = line.split_once(" = ") {
            docs.insert(name.to_string(), doc.join(" "));
            doc.clear();
        }
    }
    assert_eq!(docs.len(), EventKind::ALL.len(), "kinds found in wire/src/event.rs: {docs:?}");
    for kind in EventKind::ALL {
        let rows: Vec<_> = naive::MEANINGS.iter().filter(|(k, _, _)| *k == kind).collect();
        assert_eq!(rows.len(), 1, "{kind:?} appears {} times in the model's table", rows.len());
        let wire = docs.get(&format!("{kind:?}")).unwrap_or_else(|| panic!("{kind:?} has no doc in wire/src/event.rs"));
        assert_eq!(rows[0].1, wire, "the model's reading of {kind:?} quotes another doc than the wire format's");
    }
}

// ---- Regression tests: minimised counterexamples, each with its postmortem. ----

// Found by the model: a sub-2 MiB segment dropped under a newer one (its free was lost) kept its
// bytes in the page occupancy, so `page_stranded` stayed wrong for good. Fixed: `remove_segment`
// releases the pages whichever way a segment goes.
#[test]
fn regression_small_segment_dropped_under_a_newer_one_releases_its_page() {
    run_steps(&[
        Step::DriverAlloc { at: 0, size: 512, kind: SegmentKind::Driver, framework: false, stream: 0 },
        Step::DriverAlloc { at: 0, size: 512, kind: SegmentKind::Driver, framework: false, stream: 0 },
    ]);
    run_steps(&[
        Step::DriverAlloc { at: 6 * MIB, size: 512, kind: SegmentKind::Driver, framework: false, stream: 0 },
        Step::DriverAlloc { at: 4 * MIB, size: 6 * MIB, kind: SegmentKind::Driver, framework: false, stream: 0 },
    ]);
    let mut m = AddressSpace::default();
    m.driver_alloc(BASE, 512, SegmentKind::Driver, false, 0).expect("valid");
    assert!(m.driver_alloc(BASE, 4 * MIB, SegmentKind::Driver, false, 0).is_err());
    assert_eq!(m.figures().page_stranded, 0);
}

// Found by the model: a pool allocation dropped under a newer segment stayed "in use" in its pool,
// so later trims and `pool_reserved` readings under-counted the pool's cache. Fixed in
// `remove_segment`.
#[test]
fn regression_pool_allocation_dropped_under_a_newer_one_is_no_longer_in_use() {
    run_steps(&[
        Step::PoolAlloc { at: 24 * MIB, size: 512, pool: 1, stream: 0 },
        Step::DriverAlloc { at: 24 * MIB, size: 512, kind: SegmentKind::Driver, framework: false, stream: 0 },
        Step::PoolReserved { pool: 1, reserved: MIB },
    ]);
}

// Found by the model: freeing a pool allocation that still held a live framework block returned
// early with the anomaly, before the pool took the bytes back into its cache. Fixed: `pool_free`
// is `driver_free`, which reports the dropped blocks after doing the free.
#[test]
fn regression_pool_free_with_a_live_block_still_caches_its_bytes() {
    run_steps(&[
        Step::PoolAlloc { at: 0, size: 561_664, pool: 1, stream: 0 },
        Step::BlockAlloc { at: 0, requested: 0, known: None },
        Step::PoolFree { at: 0 },
    ]);
    let mut m = AddressSpace::default();
    m.pool_alloc(BASE, 4 * MIB, 1, 0).expect("valid");
    m.block_alloc(BASE, MIB, None).expect("valid");
    assert_eq!(m.pool_free(BASE), Err(Anomaly::LiveBlocksDropped { addr: BASE, blocks: 1 }));
    assert_eq!(m.figures().pool_cached, 4 * MIB);
}

// Found by the model: an unmap that cut through a live block kept it when it started below the
// cut (a 2 MiB piece then held a 4 MiB block: `stranded()` underflowed, a panic in debug builds)
// and lost the tail of one that started inside the cut (neither block nor free run). Fixed in
// `cut`: a block crossing either edge goes with the cut, freed first so its mapped bytes are free.
#[test]
fn regression_unmap_through_a_live_block_drops_it_and_frees_what_stays_mapped() {
    // The block (3 MiB rounded, swallowing the 1 MiB rest) starts below the cut.
    // (Two mappings joined into one segment: the driver unmaps only whole mappings.)
    run_steps(&[
        Step::Map { at: 0, size: 2 * MIB, framework: false },
        Step::Map { at: 2 * MIB, size: 2 * MIB, framework: false },
        Step::BlockAlloc { at: 0, requested: 3 * MIB, known: None },
        Step::Unmap { at: 2 * MIB, size: 2 * MIB },
    ]);
    // The block starts inside the cut and runs past it.
    run_steps(&[
        Step::Map { at: 34 * MIB, size: 2 * MIB, framework: false },
        Step::Map { at: 36 * MIB, size: 2 * MIB, framework: false },
        Step::BlockAlloc { at: 34 * MIB, requested: 0, known: Some(3 * MIB) },
        Step::Unmap { at: 34 * MIB, size: 2 * MIB },
    ]);
    // A snapshot's map entry (many driver calls) may be cut anywhere.
    let mut m = AddressSpace::default();
    m.map_pages(BASE, 8 * MIB, true).expect("valid");
    m.block_alloc(BASE + MIB, 0, Some(4 * MIB)).expect("valid");
    assert_eq!(m.unmap(BASE + 4 * MIB, 2 * MIB), Err(Anomaly::LiveBlocksDropped { addr: BASE + 4 * MIB, blocks: 1 }));
    let runs: Vec<_> = m.free_runs().map(|(s, l)| (s - BASE, l)).collect();
    assert_eq!(runs, vec![(0, 4 * MIB), (6 * MIB, 2 * MIB)]);
    let f = m.figures();
    assert_eq!((f.segments, f.blocks, f.stranded, f.releasable, f.reserved), (2, 0, 0, 6 * MIB, 6 * MIB));
}

// Issue 14: a zero-size `segment_map` followed by a `segment_unmap` looped for ever in
// `AddressSpace::unmap` (a 173-byte pickle, a 176-byte record file): the empty segment at `at`
// was never "holding" `at`, and the search for the next segment found it again. Fixed: empty
// ranges are rejected (`Anomaly::BadRange`), and the search starts strictly after `at`.
#[test]
fn regression_zero_size_map_then_unmap_terminates() {
    run_steps(&[Step::Map { at: 0, size: 0, framework: true }, Step::Unmap { at: 0, size: 2 * PAGE }]);
    let mut m = AddressSpace::default();
    assert_eq!(m.map(BASE, 0, true), Err(Anomaly::BadRange { addr: BASE, size: 0 }));
    assert_eq!(m.unmap(BASE, 2 * PAGE), Err(Anomaly::UnmapUnknown(BASE)));
    assert_eq!(m.figures().segments, 0);
}

// Issue 14: an empty segment at the start of a live one replaced it in the index, leaving its
// tiling entries orphaned; later splits walked a list that never ended (`Tiling::split`) and the
// live-block counter wrapped below zero, so `to_events` asked for a capacity overflow. Fixed by
// rejecting empty ranges; `to_events` sizes its buffer from the map's own lengths.
#[test]
fn regression_empty_segment_on_a_live_one_keeps_the_tiling_and_to_events_safe() {
    run_steps(&[
        Step::Map { at: 0, size: 2 * PAGE, framework: true },
        Step::BlockAlloc { at: 0, requested: 512, known: Some(512) },
        Step::DriverAlloc { at: 0, size: 0, kind: SegmentKind::Driver, framework: true, stream: 0 },
        Step::BlockFree { at: 0 },
        Step::BlockFree { at: 0 },
        Step::Unmap { at: PAGE, size: PAGE },
    ]);
    let mut m = AddressSpace::default();
    m.map(BASE, 2 * PAGE, true).expect("valid");
    m.block_alloc(BASE, 512, Some(512)).expect("valid");
    assert!(m.driver_alloc(BASE, 0, SegmentKind::Driver, true, 0).is_err());
    m.check_invariants().expect("invariants");
    assert_eq!(m.to_events(1, 0).len(), 2);
}

// Issue 14: a snapshot segment whose end wraps past 2^64 was accepted. Fixed: `BadRange`.
#[test]
fn regression_segment_whose_end_wraps_past_2_64_is_rejected() {
    let mut m = AddressSpace::default();
    let addr = u64::MAX - PAGE + 1;
    assert_eq!(m.driver_alloc(addr, 2 * PAGE, SegmentKind::Driver, true, 0), Err(Anomaly::BadRange { addr, size: 2 * PAGE }));
    assert_eq!(m.reserve(addr, 2 * PAGE), Err(Anomaly::BadRange { addr, size: 2 * PAGE }));
    assert!(m.driver_alloc(addr, PAGE, SegmentKind::Driver, true, 0).is_err(), "its end, 2^64, is not a u64");
    assert!(m.driver_alloc(addr - PAGE, PAGE, SegmentKind::Driver, true, 0).is_ok(), "a segment ending at 2^64 - 2 MiB is valid");
    m.check_invariants().expect("invariants");
}
