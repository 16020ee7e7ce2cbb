//! The deployment registry: deployments, services and handlers, in redb and cached in memory.
//! Every change is one write transaction; the cache is replaced only after it commits.

mod declared;
mod gates;
mod records;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, OnceLock, RwLock};

use redb::{ReadableDatabase, ReadableTable};

pub use records::{Address, Deployment, Service, ServiceOverrides, StoredHttpVersion};

use crate::discovery::Discovered;
use gates::{OnChange, declared_limits};
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::DeploymentId;
use sluice_flow::gates::Gates;
use sluice_store::storage::Store;

use sluice_store::schema::{DEPLOYMENTS, MetaGroup, SERVICES};

/// Why a registry operation was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryError {
    /// No such deployment, service or handler (404).
    NotFound(String),
    /// A catalogue-coded refusal; status from the code.
    Coded(CodedError),
}

impl From<CodedError> for RegistryError {
    fn from(err: CodedError) -> Self {
        Self::Coded(err)
    }
}

/// How a registration ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A new deployment (201).
    Created,
    /// The same URI, headers and manifest were already registered (200).
    Unchanged,
    /// An existing deployment at the URI was replaced, with `force` (200).
    Overwritten,
}

/// A registration request after discovery.
#[derive(Debug, Clone)]
pub struct Registration {
    /// Base URI.
    pub uri: String,
    /// Headers sent to the deployment.
    pub additional_headers: BTreeMap<String, String>,
    /// Operator metadata.
    pub metadata: BTreeMap<String, String>,
    /// HTTP/1.1 instead of HTTP/2.
    pub use_http_11: bool,
    /// Replace a conflicting deployment, accept type changes.
    pub force: bool,
    /// Accept service type changes (`breaking`).
    pub allow_type_change: bool,
    /// Check everything, store nothing.
    pub dry_run: bool,
}

impl Registration {
    /// A plain registration of `uri`: HTTP/2, no headers, no force, stored.
    pub fn new(uri: impl Into<String>) -> Self {
        Self {
            uri: uri.into(),
            additional_headers: BTreeMap::new(),
            metadata: BTreeMap::new(),
            use_http_11: false,
            force: false,
            allow_type_change: false,
            dry_run: false,
        }
    }
}

/// A new endpoint for an existing deployment.
#[derive(Debug, Clone)]
pub struct InPlaceUpdate {
    /// Base URI.
    pub uri: String,
    /// Replaces all additional headers.
    pub additional_headers: BTreeMap<String, String>,
    /// HTTP/1.1 instead of HTTP/2.
    pub use_http_11: bool,
    /// Skip the compatibility checks.
    pub overwrite: bool,
    /// Check everything, store nothing.
    pub dry_run: bool,
}

/// What a registration answers.
#[derive(Debug, Clone)]
pub struct Registered {
    /// How it ended.
    pub outcome: Outcome,
    /// The deployment.
    pub deployment: Deployment,
    /// Its services at their new revisions.
    pub services: Vec<Service>,
}

/// Shared records, so a lookup on the request path copies a pointer rather than a manifest.
#[derive(Debug, Clone, Default)]
struct State {
    deployments: BTreeMap<DeploymentId, Arc<Deployment>>,
    services: BTreeMap<String, Arc<Service>>,
}

/// The registry, shared by the admin API and (later) the ingress and invoker.
#[derive(Debug)]
pub struct Registry {
    store: Arc<Store>,
    state: RwLock<State>,
    /// Each deployment's gate (its declared limits, its paced drain), kept in step with the
    /// deployments.
    gates: Arc<Gates>,
    /// Called after every change, so partitions waiting at a gate look again.
    on_change: OnceLock<OnChange>,
}

fn storage_error(e: impl std::fmt::Display) -> CodedError {
    CodedError::new(Code::META0005, format!("cannot store the registry: {e}"))
}

/// The deployments and services `store` holds.
fn stored_state(store: &Store) -> Result<State, CodedError> {
    store.with_db(|db| -> Result<State, CodedError> {
        let txn = db.begin_read().map_err(storage_error)?;
        let mut state = State::default();
        if let Ok(table) = txn.open_table(DEPLOYMENTS) {
            for row in table.iter().map_err(storage_error)? {
                let (_, value) = row.map_err(storage_error)?;
                let d: Deployment = serde_json::from_slice(value.value()).map_err(storage_error)?;
                state.deployments.insert(d.id, Arc::new(d));
            }
        }
        if let Ok(table) = txn.open_table(SERVICES) {
            for row in table.iter().map_err(storage_error)? {
                let (_, value) = row.map_err(storage_error)?;
                let s: Service = serde_json::from_slice(value.value()).map_err(storage_error)?;
                state.services.insert(s.name.clone(), Arc::new(s));
            }
        }
        Ok(state)
    })?
}

impl Registry {
    /// Loads the registry from the store.
    pub fn load(store: Arc<Store>) -> Result<Self, CodedError> {
        let state = stored_state(&store)?;
        let gates = Arc::new(Gates::default());
        gates.sync(&declared_limits(&state));
        Ok(Self {
            store,
            state: RwLock::new(state),
            gates,
            on_change: OnceLock::new(),
        })
    }

    /// Takes the deployments and services the store holds now (cluster mode: another node
    /// changed them).
    pub fn reload(&self) -> Result<(), CodedError> {
        let state = stored_state(&self.store)?;
        *self.state.write().unwrap_or_else(|e| e.into_inner()) = state;
        self.changed();
        Ok(())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Every deployment, by id.
    pub fn deployments(&self) -> Vec<Arc<Deployment>> {
        self.read().deployments.values().cloned().collect()
    }

    /// One deployment.
    pub fn deployment(&self, id: DeploymentId) -> Result<Arc<Deployment>, RegistryError> {
        self.read().deployments.get(&id).cloned().ok_or_else(|| {
            RegistryError::NotFound(format!("The requested deployment '{id}' does not exist"))
        })
    }

    /// Every service, by name.
    pub fn services(&self) -> Vec<(Arc<Service>, Arc<Deployment>)> {
        let state = self.read();
        state
            .services
            .values()
            .filter_map(|s| Some((s.clone(), state.deployments.get(&s.deployment_id)?.clone())))
            .collect()
    }

    /// The names of every service, without copying their definitions.
    pub fn service_names(&self) -> Vec<String> {
        self.read().services.keys().cloned().collect()
    }

    /// One service with its deployment.
    pub fn service(&self, name: &str) -> Result<(Arc<Service>, Arc<Deployment>), RegistryError> {
        let state = self.read();
        state
            .services
            .get(name)
            .and_then(|s| Some((s.clone(), state.deployments.get(&s.deployment_id)?.clone())))
            .ok_or_else(|| {
                RegistryError::NotFound(format!("The requested service '{name}' does not exist"))
            })
    }

    /// Registers a discovered deployment (`POST /deployments`).
    pub fn register(
        &self,
        found: Discovered,
        req: Registration,
        now_ms: u64,
    ) -> Result<Registered, RegistryError> {
        let mut state = self.read().clone();
        let same_uri: Vec<&Deployment> = state
            .deployments
            .values()
            .map(Arc::as_ref)
            .filter(|d| d.uri() == Some(req.uri.as_str()))
            .collect();
        if same_uri.len() > 1 && req.force {
            let ids: Vec<String> = same_uri.iter().map(|d| d.id.to_string()).collect();
            return Err(CodedError::new(
                Code::META0017,
                format!(
                    "cannot force-register {}: deployments {} share this URI, so it is ambiguous which to replace; remove all but one first",
                    req.uri,
                    ids.join(", ")
                ),
            )
            .into());
        }
        let existing = same_uri.first().map(|d| (*d).clone());
        if let Some(existing) = &existing {
            let unchanged = existing.additional_headers == req.additional_headers
                && existing.manifest == found.manifest;
            if unchanged {
                let services = state
                    .services
                    .values()
                    .filter(|s| s.deployment_id == existing.id)
                    .map(|s| Service::clone(s))
                    .collect();
                return Ok(Registered {
                    outcome: Outcome::Unchanged,
                    deployment: existing.clone(),
                    services,
                });
            }
            if !req.force {
                return Err(CodedError::new(
                    Code::META0004,
                    format!(
                        "deployment {} is already registered at {} with different services or headers; register with force: true to replace it",
                        existing.id, req.uri
                    ),
                )
                .into());
            }
        }
        if !req.force && !req.allow_type_change {
            check_types(&state, &found)?;
        }
        let id = existing.as_ref().map_or_else(DeploymentId::new, |d| d.id);
        let created_at_ms = existing.as_ref().map_or(now_ms, |d| d.created_at_ms);
        let mut deployment = Deployment {
            id,
            address: Address::Http {
                uri: req.uri.clone(),
                use_http_11: req.use_http_11,
                http_version: found.http_version.into(),
            },
            additional_headers: req.additional_headers,
            metadata: req.metadata,
            protocol_mode: found.manifest.protocol_mode.expect("validated"),
            min_protocol_version: found.manifest.min_protocol_version,
            max_protocol_version: found.manifest.max_protocol_version,
            sdk_version: found.sdk_version,
            created_at_ms,
            manifest: found.manifest,
            revisions: BTreeMap::new(),
        };
        let services = point_services(&mut state, &mut deployment);
        state.deployments.insert(id, Arc::new(deployment.clone()));
        if !req.dry_run {
            self.commit(state)?;
        }
        let outcome = if existing.is_some() {
            Outcome::Overwritten
        } else {
            Outcome::Created
        };
        Ok(Registered {
            outcome,
            deployment,
            services,
        })
    }

    /// Replaces a deployment's endpoint in place (`PATCH`/`PUT /deployments/{id}`).
    pub fn update(
        &self,
        id: DeploymentId,
        found: Discovered,
        change: InPlaceUpdate,
    ) -> Result<Registered, RegistryError> {
        let InPlaceUpdate {
            uri,
            additional_headers,
            use_http_11,
            overwrite,
            dry_run,
        } = change;
        let mut state = self.read().clone();
        let old = state.deployments.get(&id).cloned().ok_or_else(|| {
            RegistryError::NotFound(format!("The requested deployment '{id}' does not exist"))
        })?;
        if !overwrite {
            check_in_place(&old, &found)?;
        }
        let mut deployment = Deployment {
            address: Address::Http {
                uri,
                use_http_11,
                http_version: found.http_version.into(),
            },
            additional_headers,
            protocol_mode: found.manifest.protocol_mode.expect("validated"),
            min_protocol_version: found.manifest.min_protocol_version,
            max_protocol_version: found.manifest.max_protocol_version,
            sdk_version: found.sdk_version,
            manifest: found.manifest,
            revisions: old.revisions.clone(),
            ..Deployment::clone(&old)
        };
        // Services keep their revision when updated in place; new ones start one.
        let mut services = Vec::new();
        for manifest in &deployment.manifest.services {
            let service = match state.services.get(&manifest.name) {
                Some(s) if s.deployment_id == id => Service {
                    ty: manifest.ty,
                    ..Service::clone(s)
                },
                _ => new_revision(&state, &manifest.name, manifest.ty, id),
            };
            deployment
                .revisions
                .insert(service.name.clone(), service.revision);
            state
                .services
                .insert(service.name.clone(), Arc::new(service.clone()));
            services.push(service);
        }
        state.deployments.insert(id, Arc::new(deployment.clone()));
        if !dry_run {
            self.commit(state)?;
        }
        Ok(Registered {
            outcome: Outcome::Overwritten,
            deployment,
            services,
        })
    }

    /// Removes a deployment; its services fall back to the newest other deployment serving them,
    /// or disappear.
    pub fn remove(&self, id: DeploymentId) -> Result<(), RegistryError> {
        let mut state = self.read().clone();
        if state.deployments.remove(&id).is_none() {
            return Err(RegistryError::NotFound(format!(
                "The requested deployment '{id}' does not exist"
            )));
        }
        let orphans: Vec<String> = state
            .services
            .values()
            .filter(|s| s.deployment_id == id)
            .map(|s| s.name.clone())
            .collect();
        for name in orphans {
            let fallback = state
                .deployments
                .values()
                .filter(|d| d.service(&name).is_some())
                .max_by_key(|d| d.revisions.get(&name).copied().unwrap_or(0))
                .map(|d| (d.id, d.revisions.get(&name).copied().unwrap_or(0)));
            match fallback {
                Some((deployment_id, revision)) => {
                    let s = Arc::make_mut(state.services.get_mut(&name).expect("listed"));
                    s.deployment_id = deployment_id;
                    s.revision = revision;
                }
                None => {
                    state.services.remove(&name);
                }
            }
        }
        self.commit(state)?;
        Ok(())
    }

    /// Applies operator changes to a service (`PATCH /services/{s}`).
    pub fn modify_service(
        &self,
        name: &str,
        change: impl FnOnce(&mut ServiceOverrides),
    ) -> Result<(Arc<Service>, Arc<Deployment>), RegistryError> {
        let mut state = self.read().clone();
        let service = state.services.get_mut(name).ok_or_else(|| {
            RegistryError::NotFound(format!("The requested service '{name}' does not exist"))
        })?;
        change(&mut Arc::make_mut(service).overrides);
        self.commit(state)?;
        self.service(name)
    }

    /// Writes `next` in one transaction, then makes it the cached state.
    fn commit(&self, next: State) -> Result<(), CodedError> {
        // Cluster mode: every node takes the change (nothing embedded).
        let change = self.store.meta_change(MetaGroup::Registry);
        let mut guard = self.state.write().unwrap_or_else(|e| e.into_inner());
        self.store.with_db(|db| -> Result<(), CodedError> {
            let txn = db.begin_write().map_err(storage_error)?;
            {
                let mut table = txn.open_table(DEPLOYMENTS).map_err(storage_error)?;
                for gone in guard
                    .deployments
                    .keys()
                    .filter(|id| !next.deployments.contains_key(id))
                {
                    table
                        .remove(gone.to_string().as_str())
                        .map_err(storage_error)?;
                }
                for (id, d) in &next.deployments {
                    if guard.deployments.get(id) != Some(d) {
                        let json = serde_json::to_vec(d.as_ref()).map_err(storage_error)?;
                        table
                            .insert(id.to_string().as_str(), json.as_slice())
                            .map_err(storage_error)?;
                    }
                }
                let mut table = txn.open_table(SERVICES).map_err(storage_error)?;
                for gone in guard
                    .services
                    .keys()
                    .filter(|n| !next.services.contains_key(*n))
                {
                    table.remove(gone.as_str()).map_err(storage_error)?;
                }
                for (name, s) in &next.services {
                    if guard.services.get(name) != Some(s) {
                        let json = serde_json::to_vec(s.as_ref()).map_err(storage_error)?;
                        table
                            .insert(name.as_str(), json.as_slice())
                            .map_err(storage_error)?;
                    }
                }
            }
            txn.commit().map_err(storage_error)
        })??;
        *guard = next;
        drop(guard);
        self.changed();
        change.publish()
    }
}

/// A service's next revision on deployment `id`, keeping operator overrides.
fn new_revision(
    state: &State,
    name: &str,
    ty: crate::discovery::ServiceType,
    id: DeploymentId,
) -> Service {
    let previous = state.services.get(name);
    Service {
        name: name.to_owned(),
        ty,
        revision: previous.map_or(1, |s| s.revision + 1),
        deployment_id: id,
        overrides: previous.map(|s| s.overrides.clone()).unwrap_or_default(),
    }
}

/// Points every service of `deployment` at it with a new revision; services it no longer
/// provides (when it replaces a deployment in place) fall away.
fn point_services(state: &mut State, deployment: &mut Deployment) -> Vec<Service> {
    let provided: HashSet<&str> = deployment
        .manifest
        .services
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    state
        .services
        .retain(|name, s| s.deployment_id != deployment.id || provided.contains(name.as_str()));
    let mut out = Vec::new();
    for manifest in &deployment.manifest.services {
        let service = new_revision(state, &manifest.name, manifest.ty, deployment.id);
        deployment
            .revisions
            .insert(service.name.clone(), service.revision);
        state
            .services
            .insert(service.name.clone(), Arc::new(service.clone()));
        out.push(service);
    }
    out
}

fn check_types(state: &State, found: &Discovered) -> Result<(), CodedError> {
    for manifest in &found.manifest.services {
        if let Some(previous) = state.services.get(&manifest.name)
            && previous.ty != manifest.ty
        {
            return Err(CodedError::new(
                Code::META0006,
                format!(
                    "detected a new service revision for '{}' changing the service type from {:?} to {:?}; a service type cannot change across revisions (register with force: true to accept the breaking change)",
                    manifest.name, previous.ty, manifest.ty
                ),
            ));
        }
    }
    Ok(())
}

/// In-place updates keep types, every service and handler, and the protocol range.
fn check_in_place(old: &Deployment, found: &Discovered) -> Result<(), CodedError> {
    let reject = |why: String| {
        CodedError::new(
            Code::META0016,
            format!(
                "cannot update deployment {} in place: {why}; register a new deployment instead",
                old.id
            ),
        )
    };
    let new = &found.manifest;
    if (new.min_protocol_version, new.max_protocol_version)
        != (old.min_protocol_version, old.max_protocol_version)
    {
        return Err(reject(format!(
            "the protocol range changes from [{}, {}] to [{}, {}]",
            old.min_protocol_version,
            old.max_protocol_version,
            new.min_protocol_version,
            new.max_protocol_version
        )));
    }
    for before in &old.manifest.services {
        let Some(after) = new.services.iter().find(|s| s.name == before.name) else {
            return Err(reject(format!("service '{}' is gone", before.name)));
        };
        if after.ty != before.ty {
            return Err(reject(format!(
                "service '{}' changes type from {:?} to {:?}",
                before.name, before.ty, after.ty
            )));
        }
        for handler in &before.handlers {
            if !after.handlers.iter().any(|h| h.name == handler.name) {
                return Err(reject(format!(
                    "handler '{}/{}' is gone",
                    before.name, handler.name
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::manifest::Manifest;
    use crate::discovery::{HandlerType, HttpVersion, ServiceType};

    fn discovered(add_ty: &str) -> Discovered {
        let json = serde_json::json!({
            "protocolMode": "BIDI_STREAM", "minProtocolVersion": 5, "maxProtocolVersion": 5,
            "services": [{"name": "Obj", "ty": "VIRTUAL_OBJECT",
                "handlers": [{"name": "add", "ty": add_ty}]}]
        });
        Discovered {
            manifest: Manifest::parse(json.to_string().as_bytes()).unwrap(),
            manifest_version: 3,
            http_version: HttpVersion::Http2,
            sdk_version: None,
        }
    }

    /// An invocation keeps the handler kind of the deployment it started on, even once a later
    /// deployment changed it.
    #[test]
    fn the_pinned_deployment_decides_a_handlers_kind() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let registry = Registry::load(Arc::clone(&store)).unwrap();
        let first = registry
            .register(
                discovered("EXCLUSIVE"),
                Registration::new("http://127.0.0.1:9081/"),
                1,
            )
            .unwrap();
        let mut again = Registration::new("http://127.0.0.1:9082/");
        again.force = true;
        registry.register(discovered("SHARED"), again, 2).unwrap();
        let exclusive = Some((ServiceType::VirtualObject, Some(HandlerType::Exclusive)));
        let shared = Some((ServiceType::VirtualObject, Some(HandlerType::Shared)));
        assert_eq!(registry.handler_kind(None, "Obj", "add"), shared);
        assert_eq!(
            registry.handler_kind(Some(first.deployment.id), "Obj", "add"),
            exclusive
        );
        // A pinned deployment that is gone: the latest one answers.
        assert_eq!(
            registry.handler_kind(Some(DeploymentId::new()), "Obj", "add"),
            shared
        );
        assert_eq!(registry.handler_kind(None, "Nope", "add"), None);
    }
}
