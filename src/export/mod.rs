//! Metrics export from the live state (OTLP, Prometheus). Filled by the export work (issue 6).

/// Export flags shared by `run`, `attach` and `agent`.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct ExportArgs {}

/// The observers the flags ask for.
pub fn observers(_args: &ExportArgs) -> anyhow::Result<Vec<Box<dyn crate::observe::Observer>>> {
    Ok(Vec::new())
}
