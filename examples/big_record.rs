//! Writes a big record file whose figures are known (tests/common/big.rs), for the hand-run of
//! docs/benchmarks.md ("Big inputs"): `cargo run --release --example big_record -- OUT ALLOCS
//! [LIVE] [OOM_EVERY]` prints what `gpufrag analyze OUT --json` must say.

#[path = "../tests/common/big.rs"]
mod big;

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: u64| args.get(i).map_or(Some(d), |a| a.replace('_', "").parse().ok());
    let (Some(out), Some(Some(allocs)), Some(live), Some(oom_every)) =
        (args.first(), args.get(1).map(|_| num(1, 0)), num(2, 256), num(3, 0))
    else {
        eprintln!("usage: big_record OUT ALLOCS [LIVE=256] [OOM_EVERY=0]");
        return std::process::ExitCode::from(2);
    };
    match big::write_record(std::path::Path::new(out), allocs, live, oom_every) {
        Ok(e) => {
            println!("{out}: {e:?}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{out}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
