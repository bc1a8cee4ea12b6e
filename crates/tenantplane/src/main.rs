//! The `tenantplane` binary: the operator and the commands around it.

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tenantplane",
    version,
    about = "Virtual Kubernetes clusters for teams on a shared host cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions of TenantCluster, IsolationProfile and SyncPolicy as YAML.
    Crds {
        /// Write one file per CRD into this folder instead of printing them.
        #[arg(long, value_name = "DIR")]
        out: Option<std::path::PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crds { out: None } => {
            let yaml = tenantplane_api::crds_yaml().context("rendering the CRDs as YAML")?;
            print!("{yaml}");
        }
        Command::Crds { out: Some(dir) } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, yaml) in
                tenantplane_api::crd_files().context("rendering the CRDs as YAML")?
            {
                let path = dir.join(name);
                std::fs::write(&path, yaml)
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}
