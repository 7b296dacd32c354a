//! `gpufrag completions SHELL` and `gpufrag man`: shell completions and man pages generated from
//! the command line's own definition (clap_complete, clap_mangen), so that they never drift from
//! what the binary accepts. `man` prints gpufrag(1) to stdout, or with `--dir DIR` writes it and
//! one page per subcommand (gpufrag-run(1), ...) into DIR (refused when it is not a folder; each
//! page is written to a new temporary file beside it and renamed into place, so a symlink planted
//! at a page's name is replaced, never followed).

use clap::CommandFactory;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `completions`.
#[derive(clap::Args, Debug)]
pub struct CompletionArgs {
    /// The shell: bash, zsh, fish, elvish or powershell. Bash: `gpufrag completions bash >
    /// ~/.local/share/bash-completion/completions/gpufrag`.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Arguments of `man`.
#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Write gpufrag.1 and one page per subcommand (gpufrag-run.1, ...) into this folder instead of
    /// printing gpufrag.1 (for example ~/.local/share/man/man1, then `man gpufrag-run`).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Runs `completions`.
pub fn completions(args: &CompletionArgs) -> anyhow::Result<ExitCode> {
    let mut cmd = super::Cli::command();
    let mut out = std::io::stdout().lock();
    clap_complete::generate(args.shell, &mut cmd, "gpufrag", &mut out);
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The man page of `cmd`, titled `title`, its synopsis starting with `invoked` ("gpufrag run").
fn page(cmd: clap::Command, title: &str, invoked: &str) -> anyhow::Result<Vec<u8>> {
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd.bin_name(invoked)).title(title).render(&mut buf)?;
    Ok(buf)
}

/// Runs `man`.
pub fn man(args: &ManArgs) -> anyhow::Result<ExitCode> {
    let mut cmd = super::Cli::command();
    cmd.build();
    match &args.dir {
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(&page(cmd, "gpufrag", "gpufrag")?)?;
            out.flush()?;
        }
        Some(dir) => {
            write_pages(dir, cmd)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes gpufrag.1 and gpufrag-SUB.1 for each visible subcommand into `dir`, each created anew
/// (a symlink or a file of another user in its place is refused, never followed).
fn write_pages(dir: &Path, cmd: clap::Command) -> anyhow::Result<()> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| anyhow::anyhow!("--dir {}: {e}", dir.display()))?;
    if !meta.is_dir() {
        anyhow::bail!("--dir {}: not a folder (a symlink is not followed)", dir.display());
    }
    let mut pages = vec![("gpufrag".to_string(), page(cmd.clone(), "gpufrag", "gpufrag")?)];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        let name = format!("gpufrag-{}", sub.get_name());
        pages.push((name.clone(), page(sub.clone(), &name, &format!("gpufrag {}", sub.get_name()))?));
    }
    for (name, bytes) in pages {
        let path = dir.join(format!("{name}.1"));
        replace_file(dir, &path, &bytes).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// Writes `bytes` to a temporary file created anew in `dir` (`O_EXCL`: nothing planted there is
/// opened), then renames it onto `path`.
fn replace_file(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = dir.join(format!(".gpufrag-man-{}.tmp", std::process::id()));
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(&tmp)?;
    let written = f.write_all(bytes).and_then(|()| f.sync_all()).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}
