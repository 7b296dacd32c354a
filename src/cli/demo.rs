//! `gpufrag demo`: the whole story on any machine, no GPU needed. Runs the simcuda stand-in's
//! `frag-oom` workload (the H200 fragmentation OOM, reproduced by a small caching allocator) under
//! the LD_PRELOAD shim: the live line, the OOM the moment it happens, the verdict and the fix
//! (the simulated program's own lines only with `--program-output`).
//! `--print-env` prints what to export to run your own program against the stand-ins.

use super::run;
use anyhow::{bail, Context};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `demo`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print the environment that points programs at the simcuda stand-ins, and exit.
    #[arg(long)]
    pub print_env: bool,
    /// Which workload: frag-oom (a fragmentation OOM) or small-pages (sub-2 MiB allocations
    /// strand 2 MiB pages).
    #[arg(long, default_value = "frag-oom")]
    pub scenario: String,
    /// Simulated device memory.
    #[arg(long, default_value = "16GiB")]
    pub mem: String,
    /// Show the simulated program's own output (its RESULT/EVENT lines and its PyTorch-style
    /// OOM message) as well.
    #[arg(long)]
    pub program_output: bool,
    /// Write the summary as JSON.
    #[arg(long, value_name = "PATH")]
    pub summary_json: Option<PathBuf>,
}

/// Where the stand-ins live: `simcuda/` and `simcuda-workload` next to this executable (cargo's
/// target directory, where `cargo build --workspace` puts them).
fn simcuda_dir() -> anyhow::Result<(PathBuf, PathBuf)> {
    let exe = std::env::current_exe().context("locating this executable")?;
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    let libs = dir.join("simcuda");
    let workload = dir.join("simcuda-workload");
    if !libs.join("libcuda.so.1").exists() || !workload.is_file() {
        bail!(
            "the simcuda stand-ins are not built next to {} (expected {} and {}); run `cargo build --release --workspace`",
            exe.display(),
            libs.display(),
            workload.display()
        );
    }
    Ok((libs, workload))
}

/// Runs `demo`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let (libs, workload) = simcuda_dir()?;
    let state_dir = std::env::temp_dir().join(format!("gpufrag-demo-{}", std::process::id()));
    if args.print_env {
        println!("export LD_LIBRARY_PATH={}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}", libs.display());
        println!("export SIMCUDA_MEM={}", args.mem);
        println!("export SIMCUDA_STATE_DIR={}", std::env::temp_dir().join("simcuda-demo").display());
        println!("# then: gpufrag run -- YOUR_CUDA_PROGRAM   (or {} frag-oom)", workload.display());
        return Ok(ExitCode::SUCCESS);
    }
    let scenario = match args.scenario.as_str() {
        "frag-oom" | "small-pages" => args.scenario.clone(),
        other => bail!("unknown scenario {other:?}: frag-oom or small-pages"),
    };
    std::env::set_var("SIMCUDA_MEM", &args.mem);
    std::env::set_var("SIMCUDA_STATE_DIR", &state_dir);
    std::env::set_var("LD_LIBRARY_PATH", &libs);
    eprintln!(
        "[gpufrag] demo: {scenario} on a simulated {} GPU (simcuda), traced by the LD_PRELOAD shim{}\n",
        args.mem,
        if args.program_output { "; the program's own output is mixed in" } else { " (--program-output shows the program's own lines)" }
    );
    let run_args = run::Args {
        torch_tracker: run::TorchTracker::Off,
        out: super::LiveArgs { summary_json: args.summary_json.clone(), record: None, quiet: false },
        no_follow: false,
        no_python_hook: true,
        python_interval: 1.0,
        ring_capacity: None,
        preload: None,
        export: Default::default(),
        views: Default::default(),
        program_output: args.program_output,
        cmd: vec![OsString::from(workload.as_os_str()), OsString::from(scenario)],
    };
    let code = run::run(&run_args);
    let _ = std::fs::remove_dir_all(&state_dir);
    code
}
