//! The `virtio-9p-server` binary: serves a directory over 9P2000.L.

mod cli;

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use log::info;

use virtio_9p_server::transport::socket::{ListenAddr, Listener};
use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, Server};

use cli::Cli;

/// Raises the soft fd limit to the hard limit: every fid holds an fd.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 && lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid rlimit.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    }
}

/// Socket mode: bind, then serve every client on its own thread.
fn run_socket(cli: &Cli, addr: &ListenAddr) -> Result<(), String> {
    let mut pcfg = PassthroughConfig::new(&cli.shared_dir);
    pcfg.readonly = cli.readonly;
    pcfg.security_model = cli.security_model;
    let fs = PassthroughFs::new(pcfg).map_err(|e| e.to_string())?;
    let config = Config {
        msize_max: cli.msize_max,
        ..Config::default()
    };
    let server = Arc::new(Server::new(fs, config).map_err(|e| e.to_string())?);
    let listener = Listener::bind(addr).map_err(|e| e.to_string())?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    info!(
        "serving {} on {bound} (security model {}, {}msize up to {})",
        cli.shared_dir.display(),
        cli.security_model,
        if cli.readonly { "read-only, " } else { "" },
        cli.msize_max
    );
    listener.serve(server).map_err(|e| e.to_string())
}

/// vhost-user mode (no --listen): the daemon of `virtio_9p_server::vhost_user`.
fn run_vhost_user(cli: &Cli) -> Result<(), String> {
    let mut pcfg = PassthroughConfig::new(&cli.shared_dir);
    pcfg.readonly = cli.readonly;
    pcfg.security_model = cli.security_model;
    let fs = PassthroughFs::new(pcfg).map_err(|e| e.to_string())?;
    let config = Config {
        msize_max: cli.msize_max,
        ..Config::default()
    };
    let server = Arc::new(Server::new(fs, config).map_err(|e| e.to_string())?);
    virtio_9p_server::vhost_user::run_daemon(&cli.vhost, server, cli.readonly)
}

fn main() -> ExitCode {
    if virtio_9p_server::vhost_user::wants_capabilities(std::env::args_os().skip(1)) {
        println!("{}", virtio_9p_server::vhost_user::CAPABILITIES_JSON);
        return ExitCode::SUCCESS;
    }
    let cli = Cli::parse();
    env_logger::Builder::new()
        .filter_level(cli.log_level)
        .format_timestamp_millis()
        .init();
    raise_fd_limit();
    let result = match &cli.listen {
        Some(addr) => run_socket(&cli, addr),
        None => run_vhost_user(&cli),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("virtio-9p-server: {e}");
            ExitCode::FAILURE
        }
    }
}
