//! The `tokenwire` binary: `tokenwire serve [flags]`. See `tokenwire serve --help`.

use std::process::ExitCode;

use tokenwire_io::config::{self, Command, ConfigError, EnvMap, LogFormat, ServerConfig};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let env: EnvMap = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let cli = match config::parse_args(std::env::args_os(), &env) {
        Ok(cli) => cli,
        Err(ConfigError::Cli(e)) => e.exit(),
        Err(ConfigError::Invalid(message)) => {
            eprintln!("tokenwire: {message}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Serve(args) => serve(ServerConfig::from_args(&args, random_seed()), &env),
        Command::HashKey => hash_key(),
    }
}

/// `tokenwire hash-key`: the keys file line for a key read from stdin.
fn hash_key() -> ExitCode {
    let mut line = String::new();
    if let Err(e) = std::io::stdin().read_line(&mut line) {
        eprintln!("tokenwire: cannot read the key from standard input: {e}");
        return ExitCode::FAILURE;
    }
    let key = line.trim_end_matches(['\r', '\n']);
    if key.is_empty() {
        eprintln!("tokenwire: no key on standard input (give it as one line)");
        return ExitCode::from(2);
    }
    let digest = tokenwire_core::keys::hash_key(key);
    println!("sha256 = \"{}\"", tokenwire_core::keys::to_hex(&digest));
    ExitCode::SUCCESS
}

fn serve(config: ServerConfig, env: &EnvMap) -> ExitCode {
    init_logging(config.log_format, env);
    tokenwire_io::panic_hook::install(|line| {
        tracing::error!("{line}");
        eprintln!("tokenwire: {line}");
    });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tokenwire: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(tokenwire_io::serve(
        config,
        tokenwire_io::shutdown::signal(),
    )) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "tokenwire stopped with an error");
            eprintln!("tokenwire: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Libraries that could log frame contents, prompt characters or credentials
/// at low levels, and the most verbose level each may use whatever the filter
/// asks (the `tokenizers` crate logs every replaced prompt character at trace).
const LOG_CAPS: [&str; 4] = [
    "yawc=warn",
    "hyper=info",
    "hyper_util=info",
    "tokenizers=warn",
];

/// Log filter from `TOKENWIRE_LOG` or `RUST_LOG` (default `info`). Libraries that
/// could log frame contents or credentials at low levels are capped regardless.
fn init_logging(format: LogFormat, env: &EnvMap) {
    let spec = env
        .get("TOKENWIRE_LOG")
        .or_else(|| env.get("RUST_LOG"))
        .map(String::as_str)
        .unwrap_or("info");
    let mut filter = EnvFilter::try_new(spec).unwrap_or_else(|e| {
        eprintln!("tokenwire: ignoring the log filter {spec:?}: {e}");
        EnvFilter::new("info")
    });
    for cap in LOG_CAPS {
        if let Ok(d) = cap.parse() {
            filter = filter.add_directive(d);
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// A seed for a server started without `--seed`: differs from run to run.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}
