//! The `yolofs` command: mount the filesystem, build, inspect and verify boot images, talk to a
//! running mount, pin the hypervisor's files.

mod cli;
mod commands;
mod mount;

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;

use cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(
        cli.command,
        Command::Mount(_) | Command::Keep { .. } | Command::Pin { list: false, .. }
    ) {
        // A command whose output goes into `head` ends quietly when the pipe closes, as other
        // Unix tools do. The daemons keep ignoring SIGPIPE: a control client that goes away must
        // not stop the mount.
        // SAFETY: called before any other thread exists; SIG_DFL is a valid disposition.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(&cli.log_level))
        .format_timestamp_millis()
        .init();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("yolofs: error: {}", error_message(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each said once: most of ours already quote their cause in their
/// own message (for the control socket's answers), which `{:#}` would print a second time.
fn error_message(error: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if message.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Mount(args) => mount::mount(args),
        Command::Keep { command } => std::process::exit(yolofs::keeper::keep(&command)?),
        Command::Build(args) => commands::build_command(args),
        Command::Inspect {
            boot_image,
            json,
            extents,
        } => commands::inspect(&boot_image, json, extents),
        Command::Verify {
            boot_image,
            source,
            mark,
            json,
        } => commands::verify(&boot_image, &source, mark, json),
        Command::Shared {
            boot_images,
            block_size,
            json,
        } => commands::shared(&boot_images, block_size, json),
        Command::Ctl { socket, request } => commands::ctl(&socket, request),
        Command::Pin { binaries, list } => commands::pin_command(&binaries, list),
    }
}
