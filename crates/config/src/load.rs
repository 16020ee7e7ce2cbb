//! Layering of file, environment and flags into one [`Config`], with errors that say where a bad
//! value came from.

use std::fmt;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

use super::Config;
use sluice_core::errors::{Code, CodedError};

/// Prefixes of environment variables that set configuration keys; later ones win.
const ENV_PREFIXES: [&str; 2] = ["RESTATE_", "SERVICE_"];

/// Where a configuration value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    /// A line of the config file.
    File {
        /// The file.
        path: PathBuf,
        /// 1-based line, when known.
        line: Option<usize>,
    },
    /// An environment variable.
    Env(String),
    /// A command-line flag.
    Flag(&'static str),
}

impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigSource::File {
                path,
                line: Some(line),
            } => write!(f, "{} line {line}", path.display()),
            ConfigSource::File { path, line: None } => write!(f, "{}", path.display()),
            ConfigSource::Env(var) => write!(f, "environment variable {var}"),
            ConfigSource::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// Values given as command-line flags; each is also a config key.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--data-dir` (`data-dir`).
    pub data_dir: Option<PathBuf>,
    /// `--ingress-bind` (`ingress.bind`).
    pub ingress_bind: Option<String>,
    /// `--admin-bind` (`admin.bind`).
    pub admin_bind: Option<String>,
    /// `--log-format` (`log-format`).
    pub log_format: Option<String>,
}

/// A value layered over the file, and whether it may be retried as a plain string.
struct Layered {
    path: Vec<String>,
    source: ConfigSource,
    raw: String,
    coerced: bool,
}

fn config_error(source: &ConfigSource, path: &str, message: &str) -> CodedError {
    let key = if path.is_empty() || path == "." {
        String::new()
    } else {
        format!("`{path}`: ")
    };
    CodedError::new(
        Code::RT0002,
        format!("invalid configuration: {source}: {key}{message}"),
    )
}

/// An error in a file that configuration key `key` names (a token file, a certificate), in the
/// shape of every other configuration error.
pub fn file_error(key: &str, path: &Path, message: impl fmt::Display) -> CodedError {
    let source = ConfigSource::File {
        path: path.to_path_buf(),
        line: None,
    };
    config_error(&source, key, &message.to_string())
}

/// The PEM certificates in the file `key` names; an unreadable file, or one without any, is
/// a [`file_error`].
pub fn pem_certificates(
    key: &str,
    path: &Path,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, CodedError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| file_error(key, path, e))?;
    if certs.is_empty() {
        return Err(file_error(key, path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Loads the configuration: defaults, then `file`, then `env` (`SERVICE_…`, `RESTATE_…`), then
/// `flags`.
pub fn load(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    flags: &Overrides,
) -> Result<Config, CodedError> {
    let mut table = match file {
        Some(path) => read_file(path)?,
        None => Table::new(),
    };

    let mut layers = env_layers(env);
    layers.extend(flag_layers(flags));
    for layer in &layers {
        insert(
            &mut table,
            &layer.path,
            parse_scalar(&layer.raw, layer.coerced),
        );
    }

    // An env value like `123` is read as a number; if the key wants a string, try it as one.
    loop {
        match serde_path_to_error::deserialize::<_, Config>(Value::Table(table.clone())) {
            Ok(config) => {
                validate(&config).map_err(|(path, message)| {
                    let source = origin(&layers, &path).unwrap_or(ConfigSource::File {
                        path: file.map(Path::to_path_buf).unwrap_or_default(),
                        line: None,
                    });
                    config_error(&source, &path, &message)
                })?;
                return Ok(config);
            }
            Err(err) => {
                let path = err.path().to_string();
                let message = err.inner().message().to_owned();
                let retry = layers.iter_mut().find(|l| {
                    l.coerced && l.path.join(".") == path && message.starts_with("invalid type")
                });
                if let Some(layer) = retry {
                    layer.coerced = false;
                    insert(&mut table, &layer.path, Value::String(layer.raw.clone()));
                    continue;
                }
                let source = origin(&layers, &path).unwrap_or(ConfigSource::File {
                    path: file.map(Path::to_path_buf).unwrap_or_default(),
                    line: None,
                });
                return Err(config_error(&source, &path, &message));
            }
        }
    }
}

/// Reads and checks the file on its own, so its errors carry the file line.
fn read_file(path: &Path) -> Result<Table, CodedError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CodedError::new(
            Code::RT0002,
            format!("cannot read config file {}: {e}", path.display()),
        )
    })?;
    let at = |span: Option<std::ops::Range<usize>>| ConfigSource::File {
        path: path.to_path_buf(),
        line: span.map(|s| line_of(&text, s.start)),
    };
    let deserializer = toml::Deserializer::parse(&text)
        .map_err(|e| config_error(&at(e.span()), "", e.message()))?;
    serde_path_to_error::deserialize::<_, Config>(deserializer).map_err(|e| {
        config_error(
            &at(e.inner().span()),
            &e.path().to_string(),
            e.inner().message(),
        )
    })?;
    toml::from_str(&text).map_err(|e: toml::de::Error| config_error(&at(e.span()), "", e.message()))
}

/// `SERVICE_WORKER__INVOKER__ABORT_TIMEOUT` → `["worker", "invoker", "abort-timeout"]`.
fn env_layers(env: impl IntoIterator<Item = (String, String)>) -> Vec<Layered> {
    let mut vars: Vec<(usize, String, String)> = env
        .into_iter()
        .filter_map(|(name, value)| {
            let rank = ENV_PREFIXES.iter().position(|p| name.starts_with(p))?;
            Some((rank, name, value))
        })
        .collect();
    // RESTATE_ first so SERVICE_ spellings of the same key win; names sorted for stable errors.
    vars.sort();
    vars.into_iter()
        .map(|(rank, name, raw)| {
            let key = &name[ENV_PREFIXES[rank].len()..];
            let path = key
                .split("__")
                .map(|part| part.to_ascii_lowercase().replace('_', "-"))
                .collect();
            Layered {
                path,
                source: ConfigSource::Env(name),
                raw,
                coerced: true,
            }
        })
        .collect()
}

fn flag_layers(flags: &Overrides) -> Vec<Layered> {
    let mut layers = Vec::new();
    let mut push = |flag: &'static str, path: &[&str], raw: String| {
        layers.push(Layered {
            path: path.iter().map(|p| (*p).to_owned()).collect(),
            source: ConfigSource::Flag(flag),
            raw,
            coerced: false,
        });
    };
    if let Some(dir) = &flags.data_dir {
        push("--data-dir", &["data-dir"], dir.display().to_string());
    }
    if let Some(bind) = &flags.ingress_bind {
        push("--ingress-bind", &["ingress", "bind"], bind.clone());
    }
    if let Some(bind) = &flags.admin_bind {
        push("--admin-bind", &["admin", "bind"], bind.clone());
    }
    if let Some(format) = &flags.log_format {
        push("--log-format", &["log-format"], format.clone());
    }
    layers
}

/// Reads an environment value as a TOML scalar (bool, integer, float) when it is one.
fn parse_scalar(raw: &str, coerce: bool) -> Value {
    let scalar = coerce
        .then(|| format!("v = {raw}").parse::<Table>().ok())
        .flatten()
        .and_then(|mut table| table.remove("v"))
        .filter(|v| matches!(v, Value::Boolean(_) | Value::Integer(_) | Value::Float(_)));
    scalar.unwrap_or_else(|| Value::String(raw.to_owned()))
}

fn insert(table: &mut Table, path: &[String], value: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut at = table;
    for part in parents {
        let slot = at
            .entry(part.clone())
            .or_insert_with(|| Value::Table(Table::new()));
        if !slot.is_table() {
            *slot = Value::Table(Table::new());
        }
        at = slot.as_table_mut().expect("just made a table");
    }
    at.insert(last.clone(), value);
}

/// The layer that set `path`, or one below it (an unknown key is reported at its parent).
fn origin(layers: &[Layered], path: &str) -> Option<ConfigSource> {
    let exact = layers.iter().rev().find(|l| l.path.join(".") == path);
    let below = || {
        layers.iter().rev().find(|l| {
            let joined = l.path.join(".");
            path == "." || joined.starts_with(&format!("{path}."))
        })
    };
    exact.or_else(below).map(|l| l.source.clone())
}

/// Checks that span several keys or that types alone cannot express.
fn validate(config: &Config) -> Result<(), (String, String)> {
    let retry = &config.worker.invoker.retry_policy;
    let factor = retry.exponentiation_factor;
    if !factor.is_finite() || factor < 1.0 {
        return Err((
            "worker.invoker.retry-policy.exponentiation-factor".into(),
            format!("must be a number >= 1.0, got {factor}"),
        ));
    }
    if retry.max_interval < retry.initial_interval {
        return Err((
            "worker.invoker.retry-policy.max-interval".into(),
            format!(
                "must not be shorter than initial-interval ({} < {})",
                retry.max_interval, retry.initial_interval
            ),
        ));
    }
    if config.metrics.top_scopes > crate::MAX_TOP_SCOPES {
        return Err((
            "metrics.top-scopes".into(),
            format!(
                "must be at most {} (one series per scope), got {}",
                crate::MAX_TOP_SCOPES,
                config.metrics.top_scopes
            ),
        ));
    }
    if let Some(endpoint) = &config.tracing.endpoint
        && (endpoint.len() > 2048
            || !(endpoint.starts_with("http://") || endpoint.starts_with("https://")))
    {
        return Err((
            "tracing.endpoint".into(),
            format!(
                "must be an http:// or https:// OTLP traces URL (at most 2048 bytes), got '{endpoint}'"
            ),
        ));
    }
    let (least, most) = crate::LOG_SEGMENT_SIZES;
    let segment = config.worker.log_segment_size.0;
    if !(least..=most).contains(&segment) {
        return Err((
            "worker.log-segment-size".into(),
            format!("must be between 64KiB and 1GiB, got {segment} bytes"),
        ));
    }
    let checkpoint = config.worker.log_checkpoint_interval.0;
    if checkpoint.is_zero() || checkpoint > std::time::Duration::from_secs(3600) {
        return Err((
            "worker.log-checkpoint-interval".into(),
            format!("must be longer than zero and at most 1h, got {checkpoint:?}"),
        ));
    }
    let delay = config.worker.log_apply_delay.0;
    if delay > std::time::Duration::from_secs(1) {
        return Err((
            "worker.log-apply-delay".into(),
            format!("must be at most 1s, got {delay:?}"),
        ));
    }
    config.cluster.validate()?;
    validate_sizes(config)?;
    if config.shutdown_grace_period.0.is_zero() {
        return Err((
            "shutdown-grace-period".into(),
            "must be longer than zero".into(),
        ));
    }
    Ok(())
}

/// The sizes a value passes through agree: what the ingress takes can be sent to a
/// deployment, and in cluster mode be written in one log record.
fn validate_sizes(config: &Config) -> Result<(), (String, String)> {
    let message = config.worker.invoker.message_size_limit.0;
    let record = config.record_value_limit();
    if let Some(body) = config.ingress.max_body_size {
        if body.0.saturating_add(crate::ENVELOPE) > message {
            return Err((
                "ingress.max-body-size".into(),
                format!(
                    "{} bytes do not fit in a deployment message with its envelope: keep it 64 KiB under worker.invoker.message-size-limit ({message} bytes)",
                    body.0
                ),
            ));
        }
        if let Some(record) = record
            && body.0 > u64::try_from(record).unwrap_or(u64::MAX)
        {
            return Err((
                "ingress.max-body-size".into(),
                format!(
                    "{} bytes do not fit in a partition log record: in cluster mode a value may be at most {record} bytes ({}); lower it or raise cluster.max-record-bytes",
                    body.0,
                    crate::RECORD_VALUE_RULE
                ),
            ));
        }
    }
    if let Some(record) = record
        && config.ingress.awakeable_payload_limit.0 > u64::try_from(record).unwrap_or(u64::MAX)
    {
        return Err((
            "ingress.awakeable-payload-limit".into(),
            format!(
                "{} bytes do not fit in a partition log record: in cluster mode a value may be at most {record} bytes ({}); lower it or raise cluster.max-record-bytes",
                config.ingress.awakeable_payload_limit.0,
                crate::RECORD_VALUE_RULE
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    fn message(err: CodedError) -> String {
        assert_eq!(err.code, Some(Code::RT0002));
        err.message
    }

    #[test]
    fn defaults_match_the_spec() {
        let config = load(None, env(&[]), &Overrides::default()).unwrap();
        assert_eq!(config.ingress.bind.to_string(), "127.0.0.1:8080");
        assert_eq!(config.admin.bind.to_string(), "127.0.0.1:9070");
        assert_eq!(config.data_dir, PathBuf::from("sluice-data"));
        assert_eq!(config.worker.invoker.message_size_limit.0, 32 * 1024 * 1024);
        assert_eq!(config.worker.invoker.abort_timeout.to_string(), "10m");
        assert!(config.ignored_switches().is_empty());
        assert_eq!(config.ingress_endpoint(), "http://127.0.0.1:8080/");
    }

    #[test]
    fn body_message_and_record_sizes_are_checked_against_each_other() {
        let config = load(None, env(&[]), &Overrides::default()).unwrap();
        assert_eq!(config.ingress_body_limit(), 10 * 1024 * 1024);
        assert_eq!(config.record_value_limit(), None);
        // Cluster mode lowers the default body to what a record carries.
        let cluster = [
            ("SERVICE_CLUSTER__MODE", "kafka"),
            ("SERVICE_CLUSTER__BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
            ("SERVICE_CLUSTER__SECRET", "the-nodes-own-secret"),
        ];
        let config = load(None, env(&cluster), &Overrides::default()).unwrap();
        let value = config.record_value_limit().unwrap();
        assert_eq!(value, 2 * 1024 * 1024 - 64 * 1024);
        assert_eq!(config.ingress_body_limit(), value);
        // An explicit body over either bound refuses to start, naming the keys.
        let err = message(
            load(
                None,
                env(&[
                    ("SERVICE_INGRESS__MAX_BODY_SIZE", "40MiB"),
                    ("SERVICE_WORKER__INVOKER__MESSAGE_SIZE_LIMIT", "32MiB"),
                ]),
                &Overrides::default(),
            )
            .unwrap_err(),
        );
        assert!(err.contains("message-size-limit"), "{err}");
        let mut over = cluster.to_vec();
        over.push(("SERVICE_INGRESS__MAX_BODY_SIZE", "4MiB"));
        let err = message(load(None, env(&over), &Overrides::default()).unwrap_err());
        assert!(err.contains("cluster.max-record-bytes"), "{err}");
    }

    #[test]
    fn file_then_env_then_flags() {
        let f = file(
            "data-dir = \"/from/file\"\nexperimental-enable-vqueues = true\n[admin]\nbind = \"127.0.0.1:1000\"\n",
        );
        let flags = Overrides {
            admin_bind: Some("127.0.0.1:3000".into()),
            ..Overrides::default()
        };
        let config = load(
            Some(f.path()),
            env(&[
                ("SERVICE_DATA_DIR", "/from/env"),
                ("SERVICE_EXPERIMENTAL_ENABLE_PROTOCOL_V7", "true"),
                ("SERVICE_ADMIN__BIND", "127.0.0.1:2000"),
                ("SERVICE_WORKER__INVOKER__ABORT_TIMEOUT", "30s"),
                ("UNRELATED", "x"),
            ]),
            &flags,
        )
        .unwrap();
        assert_eq!(config.data_dir, PathBuf::from("/from/env"));
        assert_eq!(config.admin.bind.port(), 3000);
        assert_eq!(config.worker.invoker.abort_timeout.0.as_secs(), 30);
        assert_eq!(
            config.ignored_switches(),
            [
                "experimental-enable-protocol-v7",
                "experimental-enable-vqueues"
            ]
        );
    }

    #[test]
    fn restate_spellings_are_aliases_and_service_wins() {
        let config = load(
            None,
            env(&[
                ("RESTATE_EXPERIMENTAL_ENABLE_VQUEUES", "true"),
                ("RESTATE_INGRESS__BIND", "127.0.0.1:1"),
                ("SERVICE_INGRESS__BIND", "127.0.0.1:2"),
            ]),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(config.experimental_enable_vqueues, Some(true));
        assert_eq!(config.ingress.bind.port(), 2);
    }

    #[test]
    fn numeric_looking_env_values_still_fill_string_keys() {
        let config = load(
            None,
            env(&[("SERVICE_DATA_DIR", "12345")]),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(config.data_dir, PathBuf::from("12345"));
    }

    #[test]
    fn unknown_file_key_names_path_and_line() {
        let f =
            file("log-level = \"info\"\n\n[worker.invoker]\nabort-timeout = \"1m\"\nbogus = 1\n");
        let msg = message(load(Some(f.path()), env(&[]), &Overrides::default()).unwrap_err());
        assert!(msg.contains("line 5"), "{msg}");
        assert!(msg.contains("worker.invoker"), "{msg}");
        assert!(msg.contains("unknown field `bogus`"), "{msg}");
    }

    #[test]
    fn bad_file_value_names_path_and_line() {
        let f = file("[worker.invoker]\n\nabort-timeout = \"soon\"\n");
        let msg = message(load(Some(f.path()), env(&[]), &Overrides::default()).unwrap_err());
        assert!(msg.contains("line 3"), "{msg}");
        assert!(msg.contains("`worker.invoker.abort-timeout`"), "{msg}");
        assert!(msg.contains("invalid duration 'soon'"), "{msg}");
    }

    #[test]
    fn toml_syntax_error_names_the_line() {
        let f = file("data-dir = \"x\"\ningress = [\n");
        let msg = message(load(Some(f.path()), env(&[]), &Overrides::default()).unwrap_err());
        assert!(msg.contains("line 2") || msg.contains("line 3"), "{msg}");
    }

    #[test]
    fn bad_env_value_names_the_variable() {
        let err = load(
            None,
            env(&[("SERVICE_EXPERIMENTAL_ENABLE_VQUEUES", "maybe")]),
            &Overrides::default(),
        )
        .unwrap_err();
        let msg = message(err);
        assert!(
            msg.contains("environment variable SERVICE_EXPERIMENTAL_ENABLE_VQUEUES"),
            "{msg}"
        );
        assert!(msg.contains("`experimental-enable-vqueues`"), "{msg}");
    }

    #[test]
    fn unknown_env_key_names_the_variable() {
        let msg = message(
            load(
                None,
                env(&[("SERVICE_WORKER__NOPE", "1")]),
                &Overrides::default(),
            )
            .unwrap_err(),
        );
        assert!(
            msg.contains("environment variable SERVICE_WORKER__NOPE"),
            "{msg}"
        );
        assert!(msg.contains("unknown field `nope`"), "{msg}");
    }

    #[test]
    fn bad_flag_names_the_flag() {
        let flags = Overrides {
            ingress_bind: Some("nowhere".into()),
            ..Overrides::default()
        };
        let msg = message(load(None, env(&[]), &flags).unwrap_err());
        assert!(msg.contains("flag --ingress-bind"), "{msg}");
        assert!(msg.contains("`ingress.bind`"), "{msg}");
    }

    #[test]
    fn bad_advertised_endpoint_is_rejected() {
        let f = file("[ingress]\nadvertised-endpoint = \"ftp://x/\"\n");
        let msg = message(load(Some(f.path()), env(&[]), &Overrides::default()).unwrap_err());
        assert!(
            msg.contains("line 2") && msg.contains("invalid advertised endpoint"),
            "{msg}"
        );
    }

    #[test]
    fn cross_field_checks() {
        let msg = message(
            load(
                None,
                env(&[(
                    "SERVICE_WORKER__INVOKER__RETRY_POLICY__EXPONENTIATION_FACTOR",
                    "0.5",
                )]),
                &Overrides::default(),
            )
            .unwrap_err(),
        );
        assert!(
            msg.contains("exponentiation-factor") && msg.contains(">= 1.0"),
            "{msg}"
        );
    }

    #[test]
    fn dump_round_trips() {
        let f = file(
            "experimental-enable-vqueues = true\n[ingress]\nadvertised-endpoint = \"unix:/tmp/s.sock\"\n",
        );
        let config = load(Some(f.path()), env(&[]), &Overrides::default()).unwrap();
        let dumped = file(&config.to_toml());
        let again = load(Some(dumped.path()), env(&[]), &Overrides::default()).unwrap();
        assert_eq!(config, again);
    }

    #[test]
    fn missing_file_is_rt0002() {
        let msg = message(
            load(
                Some(Path::new("/no/such/sluice.toml")),
                env(&[]),
                &Overrides::default(),
            )
            .unwrap_err(),
        );
        assert!(
            msg.contains("cannot read config file /no/such/sluice.toml"),
            "{msg}"
        );
    }
}
