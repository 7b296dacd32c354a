//! Views of the state: the report, the memory map picture, memory_viz export, the live feed for
//! `top`. Filled by the views work (issue 7).

/// View flags shared by `run` and `attach`.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct ViewArgs {}

/// The observers the flags ask for.
pub fn observers(_args: &ViewArgs, _summary_json: Option<&std::path::Path>) -> anyhow::Result<Vec<Box<dyn crate::observe::Observer>>> {
    Ok(Vec::new())
}
