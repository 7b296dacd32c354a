//! The step finder and the prediction of src/foresight/ on synthetic request streams (periodic,
//! growing, irregular) whose answers are known by construction, on the recorded H200 traces of
//! tests/fixtures, and on bad input (too short, no step, a cap below the reserved bytes): a note,
//! never an invented warning.

use gpufrag::alloc::pytorch::AllocConf;
use gpufrag::foresight::{find_step, forecast, prefix, Available, Growth};
use gpufrag::sim::{self, Request, RequestStream};
use std::path::Path;

const MIB: u64 = 1 << 20;

/// A stream of `steps` training-like steps: per step, allocations of `sizes(step)` on stream 0,
/// each freed (requested and completed) in reverse order at the step's end, over `base` bytes
/// held from the start.
fn stream(steps: usize, base: u64, sizes: impl Fn(usize) -> Vec<u64>) -> RequestStream {
    let mut r = Vec::new();
    let mut n = 0u32;
    r.push(Request::Alloc { size: base, stream: 0, entry: 0, traced: Some(0) });
    n += 1;
    for s in 0..steps {
        let sz = sizes(s);
        let first = n;
        for &b in &sz {
            r.push(Request::Alloc { size: b, stream: 0, entry: r.len(), traced: Some(0) });
            n += 1;
        }
        for a in (first..n).rev() {
            r.push(Request::FreeRequested { alloc: a, entry: r.len() });
            r.push(Request::FreeCompleted { alloc: a, entry: r.len() });
        }
    }
    let len = r.len();
    RequestStream {
        requests: r,
        recorded: Vec::new(),
        recorded_entry: Vec::new(),
        op_start: vec![0; len + 1],
        conf: AllocConf::default(),
        device: 0,
        entries: len,
        trace_ooms: Vec::new(),
        device_capacity_hint: None,
        non_framework_peak: 0,
        final_figures: None,
        peak_reserved: 0,
        source: "synthetic",
        unattributed: Vec::new(),
        notes: Vec::new(),
        ipc_exports: Vec::new(),
        sees_ipc: true,
        times: vec![0; len],
    }
}

#[test]
fn a_periodic_stream_is_one_step_repeated_and_never_warns_with_room() {
    let s = stream(10, 1 << 30, |_| vec![100 * MIB, 300 * MIB, 30 * MIB]);
    let st = find_step(&s.requests).unwrap();
    assert_eq!(st.growth, Growth::Periodic);
    assert_eq!(st.allocs, 3);
    assert_eq!(st.period, 9, "3 allocations and 6 frees a step");
    assert_eq!(st.repeats, 10, "{st:?}");
    let f = forecast(&s, Available::Device(4 << 30), 3).unwrap();
    assert!(f.warning.is_none(), "{f:?}");
    assert!(f.predicted_peak <= 4 << 30);
}

#[test]
fn a_growing_stream_is_extrapolated_and_warns_before_the_step_that_fails() {
    // activations grow by 64 MiB a step: step k allocates (200 + 64 k) MiB and (50 + 16 k) MiB
    let sizes = |k: usize| vec![(200 + 64 * k as u64) * MIB, (50 + 16 * k as u64) * MIB];
    let s = stream(6, 512 * MIB, sizes);
    let st = find_step(&s.requests).unwrap();
    assert_eq!(st.growth, Growth::Growing);
    assert_eq!(st.delta, vec![64 * MIB as i64, 16 * MIB as i64]);
    // the truth: the whole run simulated under a 3 GiB card fails at some step F
    let cap = 3u64 << 30;
    let whole = stream(30, 512 * MIB, sizes);
    let limits = sim::Limits { device_capacity: Some(cap), ..Default::default() };
    let truth = sim::simulate(&whole, &sim::Scenario { alloc_conf: String::new(), conf: AllocConf::default(), limits }, false);
    let oom = truth.first_oom.expect("the run fails on a 3 GiB card");
    let f_step = (oom.request - 1) / 6;
    assert!(f_step >= 6, "fails at step {f_step}");
    // seen steps 0..F-1: the next step does not fit, predicted to the byte
    let seen = stream(f_step, 512 * MIB, sizes);
    let f = forecast(&seen, Available::Device(cap), 1).unwrap();
    let w = f.warning.expect("step F does not fit");
    assert_eq!(w.steps_ahead, 1, "{w:?}");
    assert_eq!(w.predicted_peak, oom.oom.reserved + oom.oom.alloc_size, "prediction vs the whole run simulated");
    assert_eq!(w.requested, oom.oom.requested);
    // one step earlier: the next step fits, two ahead does not
    let earlier = stream(f_step - 1, 512 * MIB, sizes);
    assert!(forecast(&earlier, Available::Device(cap), 1).unwrap().warning.is_none());
    assert_eq!(forecast(&earlier, Available::Device(cap), 2).unwrap().warning.unwrap().steps_ahead, 2);
}

#[test]
fn an_irregular_stream_that_never_nears_the_limit_gives_no_warning() {
    // sizes from a fixed pseudo-random sequence, counts varying: no step
    let mut x = 12345u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let lens: Vec<usize> = (0..12).map(|_| 1 + (rnd() % 5) as usize).collect();
    let all: Vec<Vec<u64>> = lens.iter().map(|&l| (0..l).map(|_| (1 + rnd() % 64) * MIB).collect()).collect();
    let s = stream(12, 64 * MIB, |k| all[k].clone());
    match forecast(&s, Available::Device(80 << 30), 3) {
        Err(note) => assert!(note.contains("no repeating step") || note.contains("too few"), "{note}"),
        Ok(f) => assert!(f.warning.is_none(), "far from the limit, no warning: {f:?}"),
    }
}

#[test]
fn varying_shapes_take_the_envelope_of_the_steps_seen() {
    let widths = [3u64, 7, 5, 2, 6, 4];
    let s = stream(6, 0, |k| vec![widths[k] * 10 * MIB, 8 * MIB]);
    let st = find_step(&s.requests).unwrap();
    assert_eq!(st.growth, Growth::Varying);
    assert_eq!(st.last_sizes[0], 40 * MIB);
    assert_eq!(st.delta[0], 30 * MIB as i64, "the largest seen (70 MiB) less the last (40 MiB)");
}

#[test]
fn bad_input_gives_a_note_and_no_warning() {
    // too short: two steps
    let short = stream(2, MIB, |_| vec![10 * MIB]);
    let e = forecast(&short, Available::Device(1 << 30), 3).unwrap_err();
    assert!(e.contains("too few") || e.contains("no repeating step"), "{e}");
    // a cap below what the allocator already holds
    let s = stream(5, 1 << 30, |_| vec![100 * MIB]);
    let e = forecast(&s, Available::Cap(512 * MIB), 3).unwrap_err();
    assert!(e.contains("below the") && e.contains("already holds"), "{e}");
    // a record with no block events
    let dir = std::env::temp_dir().join(format!("gpufrag-foresight-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rec = dir.join("noblocks.rec");
    let mut w = gpufrag::record::Writer::create(&rec).unwrap();
    let e = gpufrag::event::Event {
        addr: 0x7f00_0000_0000,
        size: 2 * MIB,
        ..gpufrag::event::Event::new(gpufrag::event::EventKind::MemAlloc, 1, 0)
    };
    w.write(&e).unwrap();
    w.finish_at(1).unwrap();
    let err = sim::stream_of(&gpufrag::input::open(&rec, gpufrag::input::Accept::Traces).expect("opens"), None).unwrap_err();
    assert!(err.contains("only driver-level segments, no caching-allocator block"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

fn fixture(name: &str) -> RequestStream {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let opened = gpufrag::input::open(&path, gpufrag::input::Accept::Traces).unwrap_or_else(|e| panic!("{name}: {e}"));
    sim::stream_of(&opened, None).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn recorded_h200_streams_training_and_decoding_have_steps_and_no_warning_on_an_h200() {
    for name in ["whatif/train_s0_nolimit.pickle.gz", "whatif/kvcache_s0_nolimit.pickle.gz", "gpt2_varlen.pickle.gz"] {
        let s = fixture(name);
        // a live view half way through
        let half = prefix(&s, s.requests.len() / 2);
        let f = forecast(&half, Available::Device(sim::DEFAULT_DEVICE_TOTAL), 3).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(f.step.repeats >= 3, "{name}: {:?}", f.step);
        assert!(f.warning.is_none(), "{name}: the run finished on an H200: {:?}", f.warning);
        eprintln!(
            "{name}: period {} requests, {} allocations, {}, {} repeats, predicted peak {}",
            f.step.period,
            f.step.allocs,
            f.step.growth.name(),
            f.step.repeats,
            f.predicted_peak
        );
    }
}

/// The live pipeline searches a window of the last requests (foresight::FINDER_WINDOW) with the
/// allocations before it counted: on the recorded streams, the step found in the last
/// ENVELOPE_STEPS + 1 steps is the one found in the whole, and the live predictor (requests pushed one by one,
/// predictions along the way) ends at the whole stream's forecast.
#[test]
fn a_window_of_the_stream_finds_the_same_step_and_the_live_predictor_the_same_forecast() {
    use gpufrag::foresight::{find_step_in, Predictor};
    for name in ["whatif/train_s0_nolimit.pickle.gz", "whatif/kvcache_s0_nolimit.pickle.gz", "gpt2_varlen.pickle.gz"] {
        // a live view half way through (the trace's end is its teardown, no step)
        let full = fixture(name);
        let s = prefix(&full, full.requests.len() / 2);
        let whole = find_step(&s.requests).unwrap_or_else(|e| panic!("{name}: {e}"));
        // the live pipeline's shortcut: the last ENVELOPE_STEPS + 1 steps of the step found before
        let from = s.requests.len().saturating_sub((gpufrag::foresight::ENVELOPE_STEPS + 1) * whole.period);
        let before = s.requests[..from].iter().filter(|r| matches!(r, Request::Alloc { .. })).count() as u32;
        let win = find_step_in(&s.requests[from..], before).unwrap_or_else(|e| panic!("{name}: window: {e}"));
        assert_eq!(
            (win.period, win.growth, &win.last_sizes, &win.delta),
            (whole.period, whole.growth, &whole.last_sizes, &whole.delta),
            "{name}"
        );
        assert_eq!(win.allocs_before_last, whole.allocs_before_last, "{name}");
        let room = Available::Device(sim::DEFAULT_DEVICE_TOTAL);
        let mut p = Predictor::new(s.conf.clone());
        p.set_limits(Some(sim::DEFAULT_DEVICE_TOTAL), None);
        for (i, r) in s.requests.iter().enumerate() {
            p.push(*r);
            if i % 5000 == 4999 {
                let _ = p.predict(room, 3);
            }
        }
        let live = p.predict(room, 3).unwrap_or_else(|e| panic!("{name}: {e}"));
        let offline = forecast(&s, room, 3).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            (live.predicted_peak, live.reserved_now, live.warning.is_none()),
            (offline.predicted_peak, offline.reserved_now, true),
            "{name}"
        );
    }
}
