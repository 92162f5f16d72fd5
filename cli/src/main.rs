//! The `mdl` binary: parses arguments, runs one library operation, prints human or JSON output.

use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;

mod args;
mod dispatch;
mod failure;
mod init;
mod output;
mod progress;
mod serve;
mod status;

use args::{Cli, Command, CommitArgs};

/// On SIGINT or SIGTERM, removes what the command registered (a checkout's temporary file, a
/// clone's half-made directory) and exits with 130. `mdl serve` shuts down gracefully instead.
fn clean_up_on_interrupt() {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("no interrupt handler: {e}");
            return;
        }
    };
    // The handlers are installed here, before the command starts.
    let signals = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        Ok::<_, io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        ))
    });
    let (mut int, mut term) = match signals {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("no interrupt handler: {e}");
            return;
        }
    };
    std::thread::spawn(move || {
        runtime.block_on(async {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        });
        mdl::interrupt::mark_interrupted();
        mdl::interrupt::remove_registered();
        // Never `eprintln!`: with stderr a closed pipe it panics, this thread dies, and the
        // process would run on until killed.
        let _ = writeln!(io::stderr(), "interrupted");
        std::process::exit(130);
    });
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return failure::usage(e),
    };
    if !matches!(cli.command, Command::Serve { .. }) {
        keep_freed_memory();
    }
    log_to_stderr(cli.verbose);
    if !matches!(cli.command, Command::Serve { .. }) {
        clean_up_on_interrupt();
    }
    report_mapped_file_faults();
    raise_open_file_limit();
    let stdout = io::stdout();
    let mut out = stdout.lock();
    match run(&cli, &mut out) {
        Ok(code) => code,
        Err(e) => {
            // Interrupted: the handler is removing this command's files (which may be why it
            // failed) and exits with 130 once they are gone; the error is not the command's.
            if mdl::interrupt::interrupted() {
                std::thread::sleep(std::time::Duration::from_secs(30));
                std::process::exit(130);
            }
            // A closed pipe (`mdl log | head`) is not a failure.
            if e.chain().any(|c| {
                c.downcast_ref::<io::Error>()
                    .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            let _ = out.flush();
            failure::report(&e, cli.json, &mut out);
            ExitCode::from(failure::exit_code(&e))
        }
    }
}

/// Logs to stderr, plainly: warnings, or with `-v` mdl's debug lines and everything's info.
/// `MDL_LOG` overrides it with `target=level` pairs and a bare default level
/// (`MDL_LOG=mdl=trace,info`); a value that does not parse is ignored.
fn log_to_stderr(verbose: bool) {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::prelude::*;
    let default = if verbose { "mdl=debug,info" } else { "warn" };
    let filter: Targets = std::env::var("MDL_LOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| default.parse().expect("the default filters parse"));
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(io::stderr)
        .with_ansi(io::stderr().is_terminal())
        .with_target(false)
        .without_time();
    tracing_subscriber::registry()
        .with(lines)
        .with(filter)
        .init();
}

/// A file read in place through a mapping (one being committed) that another program cuts
/// short faults on the next read of its lost pages (SIGBUS): said in one line, and the command
/// stops as a kill would stop it — what it was recording is not half-recorded (a commit names
/// nothing before it has read every byte), and what it left in `.mdl/incoming` gc removes.
fn report_mapped_file_faults() {
    extern "C" fn on_fault(_: libc::c_int) {
        const LINE: &[u8] = b"error: a file mdl was reading was cut short meanwhile (another \
program truncated it) or could not be read from the disk; nothing was recorded\n";
        // SAFETY: write(2) and _exit(2) are async-signal-safe; LINE is static.
        #[allow(unsafe_code)]
        unsafe {
            libc::write(2, LINE.as_ptr().cast(), LINE.len());
            libc::_exit(1);
        }
    }
    // SAFETY: installs a handler that only calls async-signal-safe functions; the action is
    // fully initialised (zeroed, an empty mask, no flags).
    #[allow(unsafe_code)]
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_fault as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
    }
}

/// Raises this process's limit of open files to the most it may have (the soft limit to the
/// hard one, as build tools and servers do): `mdl serve` holds a connection per client and a
/// commit a descriptor per large file it maps.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with a valid, initialised struct; raising the soft limit
    // up to the hard one needs no privilege and changes nothing else.
    #[allow(unsafe_code)]
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Lets glibc's allocator keep the memory a command frees for its next allocations instead of
/// returning it to the kernel: a commit or checkout frees and allocates window-sized buffers
/// tensor after tensor, and memory handed back is page-faulted and zeroed again when taken.
/// For short-lived commands only (`mdl serve` keeps the defaults).
fn keep_freed_memory() {
    // SAFETY: mallopt only sets allocator parameters; called before any thread is started.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
    }
}

fn run(cli: &Cli, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    // The commands that make, watch or serve a repository rather than operate on one.
    match &cli.command {
        Command::Init { path } => {
            init::run(cli, path.as_ref(), out)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Serve { .. } => {
            serve::run(cli, out)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Status => return status::run(cli, out),
        Command::Clone {
            url,
            path,
            depth,
            since,
        } => {
            let on_terminal = !cli.json && io::stderr().is_terminal();
            let outcome = mdl_ops::clone(
                url,
                &cli.location()?,
                path.as_deref(),
                &cli.access(),
                (*depth, since.as_deref()),
                &progress::Bar::at_once(on_terminal),
            )?;
            let what = format!("cloned {url} into {}", outcome.dir.display());
            output::transfer(out, cli.json, &what, &outcome.transfer)?;
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
    let location = match &cli.command {
        Command::Commit(CommitArgs {
            remote: Some(url), ..
        }) => mdl_ops::Location::url(url)?,
        _ => cli.location()?,
    };
    let repo = mdl_ops::open(&location, &cli.access())?;
    dispatch::run(cli, repo.as_ref(), out)
}
