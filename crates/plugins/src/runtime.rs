//! The wasm side: one engine (pooling allocator, epoch interruption, fuel), components compiled
//! once into an `InstancePre`, warm instances pooled per plugin, and every call bounded by a
//! deadline, a memory cap and optionally fuel. A failed instance is dropped (a trapped store
//! cannot be re-entered); the next call instantiates a fresh one.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wasmtime::component::{Component, InstancePre, Linker, TypedFunc};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, StoreLimitsBuilder,
    Trap,
};

use super::bindings::{HostState, sluice::policy::host, types};
use super::{Hook, PluginSpec};

/// How often the epoch advances: the unit of every deadline.
const TICK: Duration = Duration::from_millis(1);
/// Instances alive at once across all plugins (the pool's size).
const INSTANCES: u32 = 256;
/// The largest memory any plugin may be allowed (its own cap is below).
const MAX_MEMORY: usize = 256 << 20;
/// Warm instances kept per plugin when idle.
const MAX_IDLE: usize = 16;

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The plugin trapped (a panic, an unreachable, a denied WASI import).
    Trap(String),
    /// It ran past its deadline.
    Deadline(Duration),
    /// It burned all its fuel.
    Fuel(u64),
    /// It tried to grow its memory past the cap.
    Memory(u64),
    /// It could not be instantiated.
    Instantiate(String),
}

/// Compiled components kept by sha256, so swapping a plugin's settings (or loading the
/// same bytes under another name) does not compile again.
const COMPILED_KEPT: usize = 32;

/// The shared engine; its epoch advances every millisecond on a thread of its own.
pub struct PluginEngine {
    engine: Engine,
    compiled: Mutex<HashMap<String, Component>>,
}

impl PluginEngine {
    /// An engine with the pooling allocator, epochs and fuel.
    pub fn new() -> Result<Self, String> {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(INSTANCES)
            .total_core_instances(INSTANCES * 4)
            .total_memories(INSTANCES)
            .total_tables(INSTANCES * 4)
            .max_memory_size(MAX_MEMORY);
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            .consume_fuel(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(|e| format!("cannot start wasmtime: {e:#}"))?;
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("plugin-epoch".into())
            .spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(TICK);
                }
            })
            .map_err(|e| format!("cannot start the plugin epoch thread: {e}"))?;
        Ok(Self {
            engine,
            compiled: Mutex::new(HashMap::new()),
        })
    }

    /// Compiles `bytes` for `hook` and instantiates it once to check it links and exports
    /// the hook with the right type. Errors say what is wrong with the component.
    pub fn compile(
        &self,
        name: &str,
        bytes: &[u8],
        sha256: &str,
        spec: &PluginSpec,
        instantiate_deadline: Duration,
    ) -> Result<Compiled, String> {
        let component = self.component(bytes, sha256)?;
        let export = spec.hook.export();
        if component.get_export_index(None, export).is_none() {
            return Err(format!(
                "the component does not export '{export}' (the {} hook); build it against the sluice:policy world of that hook",
                spec.hook
            ));
        }
        let mut linker = Linker::<HostState>::new(&self.engine);
        host::add_to_linker::<HostState, wasmtime::component::HasSelf<HostState>>(
            &mut linker,
            |state| state,
        )
        .map_err(|e| format!("cannot link the host imports: {e:#}"))?;
        types::add_to_linker::<HostState, wasmtime::component::HasSelf<HostState>>(
            &mut linker,
            |state| state,
        )
        .map_err(|e| format!("cannot link the host types: {e:#}"))?;
        // No ambient authority: every other import (WASI included) traps when called.
        linker
            .define_unknown_imports_as_traps(&component)
            .map_err(|e| format!("cannot stub the component's imports: {e:#}"))?;
        let pre = linker
            .instantiate_pre(&component)
            .map_err(|e| format!("the component's imports do not match sluice:policy: {e:#}"))?;
        let memory_limit = usize::try_from(spec.memory_limit.0)
            .unwrap_or(usize::MAX)
            .min(MAX_MEMORY);
        let compiled = Compiled {
            name: name.into(),
            hook: spec.hook,
            pre,
            config: Arc::new(spec.config.clone()),
            memory_limit,
            deadline: spec.deadline.0,
            instantiate_deadline: instantiate_deadline.max(spec.deadline.0),
            fuel: spec.fuel,
            idle: Mutex::new(Vec::new()),
        };
        let warm = compiled.instantiate().map_err(|failure| match failure {
            Failure::Instantiate(why) => why,
            other => format!("{other:?}"),
        })?;
        compiled.put_back(warm);
        Ok(compiled)
    }
}

impl PluginEngine {
    /// The compiled component of `bytes` (whose hash is `sha256`), compiling it if needed.
    fn component(&self, bytes: &[u8], sha256: &str) -> Result<Component, String> {
        let kept = self
            .compiled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(sha256)
            .cloned();
        if let Some(component) = kept {
            return Ok(component);
        }
        let component = Component::new(&self.engine, bytes)
            .map_err(|e| format!("not a valid wasm component: {e:#}"))?;
        let mut compiled = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        if compiled.len() >= COMPILED_KEPT {
            compiled.clear();
        }
        compiled.insert(sha256.to_owned(), component.clone());
        Ok(component)
    }
}

/// A typed entry point of one instance.
enum Export {
    Extract(TypedFunc<(types::Request,), (types::Outcome,)>),
    MatchRule(
        TypedFunc<
            (
                types::Counter,
                Vec<types::Candidate>,
                Option<types::Candidate>,
            ),
            (types::Decision,),
        >,
    ),
}

/// An instance ready to be called.
struct Warm {
    store: Store<HostState>,
    export: Export,
}

/// A compiled plugin and its pool of warm instances.
pub struct Compiled {
    name: Arc<str>,
    hook: Hook,
    pre: InstancePre<HostState>,
    config: Arc<BTreeMap<String, String>>,
    memory_limit: usize,
    deadline: Duration,
    /// Instantiation's bound: the larger of the call's deadline and the engine-wide one.
    instantiate_deadline: Duration,
    fuel: Option<u64>,
    idle: Mutex<Vec<Warm>>,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("name", &self.name)
            .field("hook", &self.hook)
            .finish_non_exhaustive()
    }
}

impl Compiled {
    fn instantiate(&self) -> Result<Warm, Failure> {
        let state = HostState {
            name: Arc::clone(&self.name),
            config: Arc::clone(&self.config),
            limits: StoreLimitsBuilder::new()
                .memory_size(self.memory_limit)
                .trap_on_grow_failure(true)
                .build(),
        };
        let mut store = Store::new(self.pre.engine(), state);
        store.limiter(|state| &mut state.limits);
        // Instantiation runs the component's start functions (a language runtime's set-up):
        // bounded, but by its own deadline, not the call's.
        store.set_epoch_deadline(ticks(self.instantiate_deadline));
        store
            .set_fuel(u64::MAX)
            .map_err(|e| Failure::Instantiate(format!("{e:#}")))?;
        let instance = self.pre.instantiate(&mut store).map_err(|e| {
            Failure::Instantiate(match e.downcast_ref::<Trap>() {
                Some(Trap::Interrupt) => format!(
                    "instantiating it ran past {:?} (plugin-limits.max-deadline)",
                    self.instantiate_deadline
                ),
                _ => format!("cannot instantiate: {}", Self::cause(&e)),
            })
        })?;
        let lookup = |e: wasmtime::Error| {
            Failure::Instantiate(format!(
                "the '{}' export has the wrong type for sluice:policy: {e:#}",
                self.hook.export()
            ))
        };
        let export = match self.hook {
            Hook::Extract => Export::Extract(
                instance
                    .get_typed_func(&mut store, "extract")
                    .map_err(lookup)?,
            ),
            Hook::MatchRule => Export::MatchRule(
                instance
                    .get_typed_func(&mut store, "match-rule")
                    .map_err(lookup)?,
            ),
        };
        Ok(Warm { store, export })
    }

    fn take(&self) -> Result<Warm, Failure> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match idle {
            Some(warm) => Ok(warm),
            None => self.instantiate(),
        }
    }

    /// Instantiates one warm instance when none is idle (a failed call dropped its own).
    pub(crate) fn refill(&self) {
        if !self
            .idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
        {
            return;
        }
        match self.instantiate() {
            Ok(warm) => self.put_back(warm),
            Err(failure) => {
                tracing::debug!(plugin = %self.name, ?failure, "cannot refill a warm instance");
            }
        }
    }

    fn put_back(&self, warm: Warm) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(warm);
        }
    }

    /// Arms the deadline and fuel of one call.
    fn arm(&self, warm: &mut Warm) -> Result<(), Failure> {
        warm.store.set_epoch_deadline(ticks(self.deadline));
        warm.store
            .set_fuel(self.fuel.unwrap_or(u64::MAX))
            .map_err(|e| Failure::Trap(format!("{e:#}")))
    }

    fn failure(&self, error: &wasmtime::Error) -> Failure {
        match error.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => Failure::Deadline(self.deadline),
            Some(Trap::OutOfFuel) => Failure::Fuel(self.fuel.unwrap_or(u64::MAX)),
            _ if format!("{error:#}").contains("forcing trap when growing memory") => {
                Failure::Memory(self.memory_limit as u64)
            }
            _ => {
                // The client gets the cause; the wasm backtrace (tens of frames of a
                // language runtime) goes to the log.
                tracing::debug!(plugin = %self.name, error = format!("{error:#}"), "plugin trapped");
                Failure::Trap(Self::cause(error))
            }
        }
    }

    /// What went wrong, without the wasm backtrace wasmtime puts in its error's context.
    fn cause(error: &wasmtime::Error) -> String {
        match error.downcast_ref::<Trap>() {
            Some(trap) => trap.to_string(),
            None => error.root_cause().to_string(),
        }
    }

    /// Calls `extract`. A failed instance is not reused.
    pub fn extract(&self, request: types::Request) -> Result<types::Outcome, Failure> {
        let mut warm = self.take()?;
        self.arm(&mut warm)?;
        let Export::Extract(func) = &warm.export else {
            return Err(Failure::Trap("the plugin is not loaded for extract".into()));
        };
        let func = *func;
        match func.call(&mut warm.store, (request,)) {
            Ok((outcome,)) => {
                self.put_back(warm);
                Ok(outcome)
            }
            Err(e) => Err(self.failure(&e)),
        }
    }

    /// Calls `match-rule`. A failed instance is not reused.
    pub fn match_rule(
        &self,
        counter: types::Counter,
        candidates: Vec<types::Candidate>,
        chosen: Option<types::Candidate>,
    ) -> Result<types::Decision, Failure> {
        let mut warm = self.take()?;
        self.arm(&mut warm)?;
        let Export::MatchRule(func) = &warm.export else {
            return Err(Failure::Trap(
                "the plugin is not loaded for match-rule".into(),
            ));
        };
        let func = *func;
        match func.call(&mut warm.store, (counter, candidates, chosen)) {
            Ok((decision,)) => {
                self.put_back(warm);
                Ok(decision)
            }
            Err(e) => Err(self.failure(&e)),
        }
    }
}

/// Epoch ticks of `deadline`, at least one.
fn ticks(deadline: Duration) -> u64 {
    u64::try_from(deadline.as_millis() / TICK.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}
