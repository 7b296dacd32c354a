//! The `gpufrag` binary: parses the command line and dispatches; exit-code policy lives in
//! `gpufrag::cli::exit_code`.

fn main() -> std::process::ExitCode {
    gpufrag::cli::main()
}
