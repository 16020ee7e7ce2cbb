//! Policy plugins: wasm components that classify requests (`extract`) or decide how rules match
//! (`match-rule`), loaded from the config file or the admin API and swapped atomically: a
//! request holds the set of plugins it started with, so a swap never changes one mid-way.

mod bindings;
mod breaker;
pub mod extract;
pub mod metrics;
mod policy;
mod pool;
pub mod runtime;
mod saved;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use sha2::{Digest, Sha256};

pub use breaker::BreakerSettings;
pub use extract::{ExtractRequest, Extracted};
pub use metrics::{Metrics, MetricsSnapshot};
pub use sluice_config::PluginLimits;
pub use sluice_config::plugins::{ConfiguredPlugin, Hook, OnError, PluginSpec};

use breaker::Breaker;
use pool::CallPool;
use runtime::{Compiled, Failure, PluginEngine};
use sluice_core::clock::now_ms;
use sluice_core::errors::{Code, CodedError};
use sluice_runtime::limits::Rules;
use sluice_store::storage::Store;

/// Where a plugin came from.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// `[[plugins]]` in the config file (read-only at runtime).
    Config,
    /// `PUT /plugins/{name}` (stored, survives restarts).
    Admin,
}

impl Source {
    /// How the admin API and the CLI name it (its serde form too).
    pub fn name(self) -> &'static str {
        match self {
            Self::Config => "config",
            Self::Admin => "admin",
        }
    }
}

/// A loaded plugin.
#[derive(Debug)]
pub struct Plugin {
    /// Its name.
    pub name: String,
    /// Its settings.
    pub spec: PluginSpec,
    /// Hex sha256 of its bytes.
    pub sha256: String,
    /// Size of its component, bytes.
    pub size: usize,
    /// Config file or admin API.
    pub source: Source,
    /// When this version was loaded, ms since the epoch.
    pub loaded_at_ms: u64,
    /// Calls, errors, latency.
    pub metrics: Metrics,
    order: u64,
    compiled: Compiled,
    breaker: Breaker,
    /// Where its calls run and its warm instances are refilled.
    pool: Arc<CallPool>,
}

impl Plugin {
    /// Makes a warm instance ready when none is idle (after a failed call dropped one) and its
    /// breaker is closed, so the next call does not pay for instantiating it.
    fn refill(&self) {
        if self.breaker.check(&self.name).is_ok() {
            self.compiled.refill();
        }
    }

    /// [`Self::refill`] on a pool thread, when the queue has room: for a caller on a shard.
    fn refill_later(self: &Arc<Self>) {
        let plugin = Arc::clone(self);
        self.pool.offer(Box::new(move || plugin.refill()));
    }
}

/// The plugins in force, in load order.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Every plugin.
    pub all: Vec<Arc<Plugin>>,
    extractors: Vec<Arc<Plugin>>,
}

impl Loaded {
    fn new(mut all: Vec<Arc<Plugin>>) -> Self {
        all.sort_by_key(|p| p.order);
        let extractors = all
            .iter()
            .filter(|p| p.spec.hook == Hook::Extract)
            .cloned()
            .collect();
        Self { all, extractors }
    }

    fn match_rule(&self) -> Option<&Arc<Plugin>> {
        self.all.iter().find(|p| p.spec.hook == Hook::MatchRule)
    }
}

/// The plugin set of a running Sluice.
pub struct Plugins {
    engine: OnceLock<PluginEngine>,
    loaded: RwLock<Arc<Loaded>>,
    /// Serializes changes (loads are slow; requests never wait on this).
    changing: Mutex<()>,
    next_order: AtomicU64,
    store: Option<Arc<Store>>,
    rules: Option<Arc<Rules>>,
    /// What instantiating a plugin may take (`plugin-limits.max-deadline`).
    instantiate_deadline: Duration,
    /// Where calls run (started with the first plugin).
    pool: OnceLock<Arc<CallPool>>,
    /// `plugin-limits.threads` and `plugin-limits.call-queue`.
    pool_size: (usize, usize),
    /// `plugin-limits.breaker-failures` and `breaker-cooldown`.
    breaker: BreakerSettings,
}

impl std::fmt::Debug for Plugins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugins")
            .field("loaded", &self.current().all.len())
            .finish_non_exhaustive()
    }
}

/// The coded error of a failed call of plugin `name`.
pub(crate) fn failure_error(name: &str, failure: &Failure) -> CodedError {
    match failure {
        Failure::Trap(why) => {
            CodedError::new(Code::PLG0002, format!("plugin '{name}' trapped: {why}"))
        }
        Failure::Deadline(deadline) => CodedError::new(
            Code::PLG0003,
            format!("plugin '{name}' ran past its deadline of {deadline:?} and was stopped"),
        ),
        Failure::Fuel(fuel) => CodedError::new(
            Code::PLG0003,
            format!("plugin '{name}' burned its fuel ({fuel}) and was stopped"),
        ),
        Failure::Memory(cap) => CodedError::new(
            Code::PLG0005,
            format!("plugin '{name}' tried to grow its memory past its cap of {cap} bytes"),
        ),
        Failure::Instantiate(why) => CodedError::new(
            Code::PLG0002,
            format!("plugin '{name}' could not be instantiated: {why}"),
        ),
    }
}

impl Plugins {
    /// No plugins yet. Admin-loaded plugins are stored in `store`; a `match-rule` plugin
    /// becomes the policy of `rules`.
    pub fn new(store: Option<Arc<Store>>, rules: Option<Arc<Rules>>) -> Self {
        Self {
            engine: OnceLock::new(),
            loaded: RwLock::new(Arc::new(Loaded::default())),
            changing: Mutex::new(()),
            next_order: AtomicU64::new(0),
            store,
            rules,
            instantiate_deadline: Duration::from_secs(1),
            pool: OnceLock::new(),
            pool_size: (2, 1024),
            breaker: BreakerSettings::default(),
        }
    }

    /// Takes `limits`: instantiating a plugin is bounded by `max-deadline` rather than by its
    /// call's deadline (instantiation copies the plugin's memory image and runs its start
    /// functions, which for a component carrying a language runtime, CPython's 12 MiB image,
    /// is several milliseconds, more than a call's 10 ms default on a busy machine); calls run
    /// on `threads` behind a queue of `call-queue`; a plugin's breaker opens after
    /// `breaker-failures` failed calls in a row.
    pub fn limited_by(mut self, limits: &PluginLimits) -> Self {
        self.instantiate_deadline = limits.max_deadline.0;
        self.pool_size = (limits.threads.get(), limits.call_queue.get());
        self.breaker = BreakerSettings {
            failures: limits.breaker_failures,
            cooldown: limits.breaker_cooldown.0,
        };
        self
    }

    /// Loads the config file's plugins (any failure stops start-up), then the stored ones
    /// (one that no longer loads is logged and left out).
    pub fn start(&self, configured: &[ConfiguredPlugin]) -> Result<(), CodedError> {
        for plugin in configured {
            let bytes = std::fs::read(&plugin.path).map_err(|e| {
                CodedError::new(
                    Code::PLG0001,
                    format!(
                        "plugin '{}': cannot read {}: {e}",
                        plugin.name,
                        plugin.path.display()
                    ),
                )
            })?;
            self.load(&plugin.name, &bytes, plugin.spec(), Source::Config)?;
        }
        let Some(store) = &self.store else {
            return Ok(());
        };
        for saved in saved::load_all(store)? {
            if self.get(&saved.name).is_some() {
                tracing::warn!(plugin = %saved.name, "a stored plugin has the name of a config-file plugin; the config file's wins");
                continue;
            }
            self.install_saved(saved, "a stored plugin no longer loads; left out");
        }
        Ok(())
    }

    /// Installs a stored plugin in its place of the load order; one that does not load is
    /// logged (`why`) and left out.
    fn install_saved(&self, saved: saved::Saved, why: &str) {
        self.next_order
            .fetch_max(saved.saved.order, Ordering::Relaxed);
        if let Err(e) = self.install(
            &saved.name,
            &saved.bytes,
            saved.saved.spec,
            Source::Admin,
            Some(saved.saved.order),
        ) {
            tracing::error!(plugin = %saved.name, error = %e, "{why}");
        }
    }

    /// Takes the stored plugins as the store holds them now (cluster mode: another node loaded
    /// or unloaded one). Config-file plugins stay; a stored plugin that does not load is logged
    /// and left out, as at start-up.
    pub fn reload_saved(&self) -> Result<(), CodedError> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let _changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let stored = saved::load_all(store)?;
        let current = self.current();
        let kept = current
            .all
            .iter()
            .filter(|p| p.source == Source::Config || stored.iter().any(|s| s.name == p.name))
            .cloned()
            .collect();
        self.publish(Loaded::new(kept));
        for saved in stored {
            let same = self.get(&saved.name).is_some_and(|p| {
                p.source == Source::Config
                    || (p.sha256 == hex(&Sha256::digest(&saved.bytes))
                        && p.spec == saved.saved.spec)
            });
            if !same {
                self.install_saved(
                    saved,
                    "a plugin loaded on another node does not load here; left out",
                );
            }
        }
        Ok(())
    }

    fn pool(&self) -> Result<&Arc<CallPool>, CodedError> {
        if let Some(pool) = self.pool.get() {
            return Ok(pool);
        }
        let (threads, queue) = self.pool_size;
        let pool = Arc::new(CallPool::start(threads, queue)?);
        Ok(self.pool.get_or_init(|| pool))
    }

    fn engine(&self) -> Result<&PluginEngine, CodedError> {
        if let Some(engine) = self.engine.get() {
            return Ok(engine);
        }
        let engine = PluginEngine::new().map_err(|e| CodedError::new(Code::PLG0001, e))?;
        Ok(self.engine.get_or_init(|| engine))
    }

    /// The plugins in force now.
    pub fn current(&self) -> Arc<Loaded> {
        Arc::clone(&self.loaded.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Plugin `name`, if loaded.
    pub fn get(&self, name: &str) -> Option<Arc<Plugin>> {
        self.current().all.iter().find(|p| p.name == name).cloned()
    }

    /// Loads (or atomically replaces) plugin `name`; an admin-loaded plugin is stored. On
    /// any error the previous version stays.
    pub fn load(
        &self,
        name: &str,
        bytes: &[u8],
        spec: PluginSpec,
        source: Source,
    ) -> Result<Arc<Plugin>, CodedError> {
        let _changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let existing = self.get(name);
        if source == Source::Admin
            && existing
                .as_ref()
                .is_some_and(|p| p.source == Source::Config)
        {
            return Err(CodedError::new(
                Code::PLG0007,
                format!("plugin '{name}' comes from the config file: change it there and restart"),
            ));
        }
        let order = existing.map(|p| p.order);
        let plugin = self.install(name, bytes, spec, source, order)?;
        if source == Source::Admin
            && let Some(store) = &self.store
        {
            let record = saved::SavedSpec {
                order: plugin.order,
                spec: plugin.spec.clone(),
            };
            if let Err(e) = saved::put(store, name, &record, bytes) {
                tracing::error!(plugin = name, error = %e, "plugin loaded but not stored: it will be gone after a restart");
                return Err(e);
            }
        }
        Ok(plugin)
    }

    fn install(
        &self,
        name: &str,
        bytes: &[u8],
        spec: PluginSpec,
        source: Source,
        order: Option<u64>,
    ) -> Result<Arc<Plugin>, CodedError> {
        sluice_config::plugins::check_name(name).map_err(|e| CodedError::new(Code::PLG0001, e))?;
        let current = self.current();
        if spec.hook == Hook::MatchRule
            && let Some(other) = current.match_rule()
            && other.name != name
        {
            return Err(CodedError::new(
                Code::PLG0007,
                format!(
                    "plugin '{}' is the match-rule plugin already: only one may be loaded (replace it by name, or unload it first)",
                    other.name
                ),
            ));
        }
        let sha256 = hex(&Sha256::digest(bytes));
        let compiling = std::time::Instant::now();
        let pool = Arc::clone(self.pool()?);
        let compiled = self
            .engine()?
            .compile(name, bytes, &sha256, &spec, self.instantiate_deadline)
            .map_err(|why| CodedError::new(Code::PLG0001, format!("plugin '{name}': {why}")))?;
        let plugin = Arc::new(Plugin {
            name: name.to_owned(),
            sha256,
            size: bytes.len(),
            spec,
            source,
            loaded_at_ms: now_ms(),
            metrics: Metrics::default(),
            order: order.unwrap_or_else(|| self.next_order.fetch_add(1, Ordering::Relaxed) + 1),
            compiled,
            breaker: Breaker::new(self.breaker),
            pool,
        });
        let mut all: Vec<Arc<Plugin>> = current
            .all
            .iter()
            .filter(|p| p.name != name)
            .cloned()
            .collect();
        all.push(Arc::clone(&plugin));
        self.publish(Loaded::new(all));
        let compile_ms = compiling.elapsed().as_millis();
        tracing::info!(plugin = name, hook = %plugin.spec.hook, sha256 = %plugin.sha256, compile_ms, "plugin loaded");
        Ok(plugin)
    }

    /// Unloads plugin `name` (PLG0006 when it is not loaded, PLG0007 for config-file ones).
    pub fn unload(&self, name: &str) -> Result<(), CodedError> {
        let _changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.current();
        let Some(plugin) = current.all.iter().find(|p| p.name == name) else {
            return Err(CodedError::new(
                Code::PLG0006,
                format!("no plugin named '{name}' is loaded"),
            ));
        };
        if plugin.source == Source::Config {
            return Err(CodedError::new(
                Code::PLG0007,
                format!("plugin '{name}' comes from the config file: remove it there and restart"),
            ));
        }
        if let Some(store) = &self.store {
            saved::remove(store, name)?;
        }
        let rest = current
            .all
            .iter()
            .filter(|p| p.name != name)
            .cloned()
            .collect();
        self.publish(Loaded::new(rest));
        tracing::info!(plugin = name, "plugin unloaded");
        Ok(())
    }

    fn publish(&self, loaded: Loaded) {
        let policy = loaded.match_rule().map(|p| {
            Arc::new(policy::MatchRule(Arc::clone(p))) as Arc<dyn sluice_flow::RulePolicy>
        });
        let changed_policy = {
            let old = self.current();
            old.match_rule().map(Arc::as_ptr) != loaded.match_rule().map(Arc::as_ptr)
        };
        *self.loaded.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(loaded);
        if changed_policy && let Some(rules) = &self.rules {
            rules.set_policy(policy);
        }
    }

    /// Runs the extract plugins over `request` on a plugin thread, never the caller's: the
    /// answer is awaited. Without any plugin, answers `None` at once without building the
    /// request. A full queue is refused at once (PLG0011).
    pub fn extract(
        &self,
        request: impl FnOnce() -> ExtractRequest,
    ) -> Option<impl Future<Output = Result<Extracted, CodedError>> + Send + 'static> {
        let loaded = self.current();
        if loaded.extractors.is_empty() {
            return None;
        }
        let request = request();
        let (answer, answered) = tokio::sync::oneshot::channel();
        let submitted = self.pool().and_then(|pool| {
            pool.submit(Box::new(move || {
                // The client left while the call waited for a thread: nobody reads it.
                if answer.is_closed() {
                    return;
                }
                let _ = answer.send(extract::run(&loaded.extractors, request));
                for plugin in &loaded.extractors {
                    plugin.refill();
                }
            }))
        });
        Some(async move {
            submitted?;
            answered.await.unwrap_or_else(|_| {
                Err(CodedError::new(
                    Code::PLG0002,
                    "a plugin call failed on its thread without an answer",
                ))
            })
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_plugins_extract_costs_nothing_and_bad_components_are_refused() {
        let plugins = Plugins::new(None, None);
        assert!(
            plugins
                .extract(|| -> ExtractRequest { unreachable!("not built without plugins") })
                .is_none()
        );
        let refused = plugins
            .load(
                "p",
                b"\0asm\x01\0\0\0",
                PluginSpec::new(Hook::Extract),
                Source::Admin,
            )
            .unwrap_err();
        assert_eq!(refused.code, Some(Code::PLG0001));
        assert!(
            refused.message.contains("not a valid wasm component"),
            "{}",
            refused.message
        );
        let empty_component = b"\0asm\x0d\0\x01\0";
        let refused = plugins
            .load(
                "p",
                empty_component,
                PluginSpec::new(Hook::MatchRule),
                Source::Admin,
            )
            .unwrap_err();
        assert!(
            refused.message.contains("does not export 'match-rule'"),
            "{}",
            refused.message
        );
        let refused = plugins
            .load(
                "bad name!",
                empty_component,
                PluginSpec::new(Hook::Extract),
                Source::Admin,
            )
            .unwrap_err();
        assert!(
            refused.message.contains("invalid plugin name"),
            "{}",
            refused.message
        );
        assert!(plugins.current().all.is_empty());
        let missing = plugins.unload("p").unwrap_err();
        assert_eq!(missing.code, Some(Code::PLG0006));
    }
}
