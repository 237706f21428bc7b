//! Placeholder until the demo lands.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {}
pub fn run(_: DemoArgs) -> Result<(), Box<dyn std::error::Error>> {
    Err("demo not built yet".into())
}
