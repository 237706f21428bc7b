//! `tcps man DIR` and `tcps completions SHELL` (hidden; `make install` runs
//! them): manual pages (clap_mangen) and shell completions (clap_complete)
//! made from the same clap definitions `--help` prints, so they never drift
//! from the options.

use clap::Command;
use clap_complete::Shell;
use std::io;
use std::path::Path;

/// Writes `tcps.1` and `tcps-SUB.1` (`tcps-bench-ttcp.1`, ... for nested
/// subcommands) for every visible subcommand into `dir`.
pub fn write_man_pages(mut top: Command, dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    // build() propagates the version and global settings to the subcommands.
    top.build();
    write_page(&top, "tcps", dir)?;
    for sub in top.get_subcommands().filter(|s| shown(s)) {
        write_subcommand_pages(sub, "tcps", dir)?;
    }
    Ok(())
}

fn write_subcommand_pages(cmd: &Command, parent: &str, dir: &Path) -> io::Result<()> {
    let name = format!("{parent}-{}", cmd.get_name());
    write_page(cmd, &name, dir)?;
    for sub in cmd.get_subcommands().filter(|s| shown(s)) {
        write_subcommand_pages(sub, &name, dir)?;
    }
    Ok(())
}

fn write_page(cmd: &Command, name: &str, dir: &Path) -> io::Result<()> {
    // The title and NAME use the dashed name (`tcps-run`), which man(1)
    // looks up; the synopsis the words one types (`tcps run`).
    // clap's `help` subcommand gets no page of its own (`shown`): hidden,
    // so the page names no `tcps-help(1)` that does not exist.
    let page = cmd
        .clone()
        .name(name.to_string())
        .bin_name(name.replace('-', " "))
        .mut_subcommands(|s| {
            if s.get_name() == "help" {
                s.hide(true)
            } else {
                s
            }
        });
    let mut out = Vec::new();
    clap_mangen::Man::new(page).render(&mut out)?;
    std::fs::write(dir.join(format!("{name}.1")), out)
}

/// Subcommands that get a page or a completion: not hidden (`man`,
/// `completions`), not clap's own `help`.
fn shown(cmd: &Command) -> bool {
    !cmd.is_hide_set() && cmd.get_name() != "help"
}

/// The completion script for `shell` (bash, zsh, fish, ...).
pub fn completion(top: Command, shell: Shell) -> String {
    let mut visible = without_hidden_subcommands(top);
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut visible, "tcps", &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// `top` without its hidden subcommands: clap_complete offers every
/// subcommand, and `tcps man`/`tcps completions` are build steps, not
/// commands for an operator to discover.
fn without_hidden_subcommands(top: Command) -> Command {
    let visible: Vec<Command> = top
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .cloned()
        .collect();
    let mut cmd = Command::new(top.get_name().to_string())
        .args(top.get_arguments().cloned())
        .subcommands(visible);
    if let Some(version) = top.get_version() {
        cmd = cmd.version(version.to_string());
    }
    if let Some(about) = top.get_about() {
        cmd = cmd.about(about.clone());
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every page a page names under its subcommands exists: clap's `help`
    /// subcommand was listed as `tcps-help(1)`, which has no page.
    #[test]
    fn pages_name_only_pages_that_exist() {
        let dir = std::env::temp_dir().join(format!("tcps-man-{}", std::process::id()));
        write_man_pages(crate::Cli::command(), &dir).unwrap();
        let pages: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        for page in &pages {
            let text = std::fs::read_to_string(dir.join(page)).unwrap();
            for named in text.split_whitespace().filter(|w| w.ends_with("(1)")) {
                let file = format!("{}.1", named.trim_end_matches("(1)").replace("\\-", "-"));
                assert!(pages.contains(&file), "{page} names {named}: no {file}");
            }
        }
        assert!(pages.contains(&"tcps-run.1".to_string()), "{pages:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
