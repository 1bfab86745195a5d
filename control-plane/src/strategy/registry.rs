//! The strategies this control plane can run: the built-ins, and plugins loaded by name from the
//! plugin directory. Every call goes through here: on its own thread under the deadline, its
//! reply read and checked before the caller sees it. A strategy that misses a deadline is
//! disabled for the life of the process; a loaded library is never unloaded.
//!
//! It holds no cluster state: which strategy is active and its config live in the cluster
//! state in KV, and the caller passes them in. What it keeps besides the strategies is this
//! replica's record of each one's last failure, for `GET /v1/plugins`.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, PoisonError, RwLock,
    },
    time::Duration,
};

use chronoshard_plugin_api::{
    abi::{Reply, Status, StrategyVTable},
    Assignment, Input,
};
use serde::Serialize;
use tracing::{info, warn};

use super::{builtin, call, library, plugin_dir, validate, Error};

/// How long a strategy call may take unless configured otherwise.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(1);

/// How to build a [`Registry`].
#[derive(Clone, Debug)]
pub struct Options {
    /// Where plugins are loaded from (`--plugin-dir`); `None` allows built-ins only.
    pub plugin_dir: Option<PathBuf>,
    /// Longest a strategy call may take before the strategy is disabled.
    pub deadline: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            plugin_dir: None,
            deadline: DEFAULT_DEADLINE,
        }
    }
}

/// Where a strategy comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "origin", rename_all = "snake_case")]
pub enum Origin {
    /// Linked into the control plane.
    Builtin,
    /// Loaded from this file of the plugin directory.
    File { path: PathBuf },
}

/// A registered strategy, as `GET /v1/plugins` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StrategyInfo {
    /// The name it is activated by.
    pub name: String,
    /// Built in, or loaded from a file.
    #[serde(flatten)]
    pub origin: Origin,
    /// The plugin ABI version it was built for.
    pub abi_version: u32,
    /// Refused since a call missed its deadline.
    pub disabled: bool,
    /// The last failure of a call or a load on this replica, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<Failure>,
}

/// A strategy's last failure on this replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Failure {
    /// When it happened.
    pub at: chrono::DateTime<chrono::Utc>,
    /// The kind of failure ([`Error::reason`]).
    pub reason: &'static str,
    /// The error in full.
    pub message: String,
}

struct Entry {
    name: String,
    origin: Origin,
    vtable: &'static StrategyVTable,
    disabled: AtomicBool,
}

impl Entry {
    fn info(&self, last_error: Option<Failure>) -> StrategyInfo {
        StrategyInfo {
            name: self.name.clone(),
            origin: self.origin.clone(),
            abi_version: self.vtable.abi_version(),
            disabled: self.disabled.load(Ordering::Relaxed),
            last_error,
        }
    }
}

struct Inner {
    plugin_dir: Option<PathBuf>,
    deadline: Duration,
    entries: RwLock<BTreeMap<String, Arc<Entry>>>,
    /// Strategy name → its last failure. Also names that are not registered (a load that
    /// failed), so the active strategy's trouble shows even when it never loaded.
    failures: Mutex<BTreeMap<String, Failure>>,
}

/// The strategy registry; cheap to clone, every clone the same registry.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("plugin_dir", &self.inner.plugin_dir)
            .field("deadline", &self.inner.deadline)
            .field("strategies", &self.list())
            .finish()
    }
}

impl Registry {
    /// A registry holding the built-in strategies.
    pub fn new(options: Options) -> Registry {
        let entries = builtin::builtins()
            .into_iter()
            .map(|vtable| {
                let entry = Entry {
                    name: vtable.name(),
                    origin: Origin::Builtin,
                    vtable,
                    disabled: AtomicBool::new(false),
                };
                (entry.name.clone(), Arc::new(entry))
            })
            .collect();
        Registry {
            inner: Arc::new(Inner {
                plugin_dir: options.plugin_dir,
                deadline: options.deadline,
                entries: RwLock::new(entries),
                failures: Mutex::new(BTreeMap::new()),
            }),
        }
    }

    /// The plugin directory, if one is configured.
    pub fn plugin_dir(&self) -> Option<&std::path::Path> {
        self.inner.plugin_dir.as_deref()
    }

    /// Every registered strategy, by name.
    pub fn list(&self) -> Vec<StrategyInfo> {
        let entries = self.inner.entries.read();
        let entries = entries.unwrap_or_else(PoisonError::into_inner);
        entries
            .values()
            .map(|e| e.info(self.last_error(&e.name)))
            .collect()
    }

    /// One registered strategy.
    pub fn info(&self, name: &str) -> Option<StrategyInfo> {
        self.entry(name).map(|e| e.info(self.last_error(name)))
    }

    /// The last failure of strategy `name` on this replica, registered or not.
    pub fn last_error(&self, name: &str) -> Option<Failure> {
        let failures = self.inner.failures.lock();
        failures
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    fn note(&self, name: &str, error: &Error) {
        let failure = Failure {
            at: chrono::Utc::now(),
            reason: error.reason(),
            message: error.to_string(),
        };
        let mut failures = self
            .inner
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        failures.insert(name.to_string(), failure);
    }

    fn entry(&self, name: &str) -> Option<Arc<Entry>> {
        let entries = self.inner.entries.read();
        entries
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// Loads plugin `name` from the plugin directory (`<dir>/<name>.so`) and registers it.
    ///
    /// Loading a name already loaded from a file returns it as it is: a library is never
    /// unloaded or replaced, so a new build of a plugin takes a restart. A built-in's name is
    /// refused. Blocking work (resolving, `dlopen`, the library's initialisers) runs on the
    /// blocking pool.
    pub async fn load(&self, name: &str) -> Result<StrategyInfo, Error> {
        plugin_dir::check_name(name)?;
        if let Some(entry) = self.entry(name) {
            return match entry.origin {
                Origin::Builtin => Err(Error::BuiltinName {
                    name: name.to_string(),
                }),
                Origin::File { .. } => Ok(entry.info(self.last_error(name))),
            };
        }
        let dir = self.inner.plugin_dir.clone().ok_or(Error::NoPluginDir)?;
        let owned = name.to_string();
        let opened = tokio::task::spawn_blocking(move || {
            let path = plugin_dir::resolve(&dir, &owned)?;
            library::open(&owned, &path).map(|vtable| (path, vtable))
        })
        .await;
        let lost = || Error::Lost {
            name: name.to_string(),
        };
        let (path, vtable) = opened.map_err(|_| lost())??;
        info!(strategy = name, path = %path.display(), "strategy plugin loaded");
        let mut entries = self
            .inner
            .entries
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        // Two loads of one name at once: the first registered stays; both point into the same
        // library (a second dlopen of a file returns the library already loaded).
        let entry = entries.entry(name.to_string()).or_insert_with(|| {
            Arc::new(Entry {
                name: name.to_string(),
                origin: Origin::File { path },
                vtable,
                disabled: AtomicBool::new(false),
            })
        });
        Ok(entry.info(self.last_error(name)))
    }

    /// The strategy if registered, else loaded from the plugin directory: what every replica
    /// calls for the strategy the cluster state names, so the next leader has it. A failure is
    /// recorded as the strategy's last error.
    pub async fn ensure(&self, name: &str) -> Result<StrategyInfo, Error> {
        if let Some(info) = self.info(name) {
            return Ok(info);
        }
        let loaded = self.load(name).await;
        if let Err(e) = &loaded {
            self.note(name, e);
        }
        loaded
    }

    /// Asks strategy `name` whether it accepts `config`, before the config is activated.
    pub async fn validate_config(
        &self,
        name: &str,
        config: &serde_json::Value,
    ) -> Result<(), Error> {
        let entry = self.usable(name)?;
        let body = serde_json::to_vec(config).map_err(|e| Error::InvalidInput {
            reason: format!("config: {e}"),
        })?;
        let vtable = entry.vtable;
        let reply = self
            .run(&entry, move || vtable.validate_config(&body))
            .await
            // A missed deadline disables the strategy whoever called: it is its last error.
            .inspect_err(|e| self.note(name, e))?;
        read_status(name, reply).map(drop)
    }

    /// Runs strategy `name` on `input` (which carries the previous assignment and the
    /// strategy's config) and returns its assignment once checked: every shard exactly once, on
    /// live nodes that are not draining, within capacity. On any error the caller keeps the
    /// assignment in force, and the error is recorded as the strategy's last one (except
    /// `Disabled`, which would hide the missed deadline that disabled it).
    pub async fn assign(&self, name: &str, input: Input) -> Result<Assignment, Error> {
        let result = self.call_assign(name, input).await;
        match &result {
            Err(Error::Disabled { .. }) | Ok(_) => {}
            Err(e) => self.note(name, e),
        }
        result
    }

    async fn call_assign(&self, name: &str, input: Input) -> Result<Assignment, Error> {
        let entry = self.usable(name)?;
        validate::check_input(&input).map_err(|reason| Error::InvalidInput { reason })?;
        let vtable = entry.vtable;
        let strategy = entry.name.clone();
        // Encoding, the call, decoding and the check all run on the call's thread: a large
        // cluster costs that thread, not the caller's runtime.
        self.run(&entry, move || {
            let json = serde_json::to_vec(&input).map_err(|e| Error::InvalidInput {
                reason: e.to_string(),
            })?;
            let body = read_status(&strategy, vtable.assign(&json))?;
            let pairs = validate::parse_output(&body).map_err(|e| Error::BadReply {
                name: strategy.clone(),
                reason: format!("not an assignment in JSON: {e}"),
            })?;
            validate::check(&input, pairs).map_err(|violation| Error::InvalidAssignment {
                name: strategy,
                violation,
            })
        })
        .await?
    }

    fn usable(&self, name: &str) -> Result<Arc<Entry>, Error> {
        let entry = self.entry(name).ok_or_else(|| Error::Unknown {
            name: name.to_string(),
        })?;
        if entry.disabled.load(Ordering::Relaxed) {
            return Err(Error::Disabled {
                name: name.to_string(),
            });
        }
        Ok(entry)
    }

    async fn run<T: Send + 'static>(
        &self,
        entry: &Entry,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Error> {
        let deadline = self.inner.deadline;
        let result = call::on_thread(&entry.name, deadline, work).await;
        // A built-in is this binary's own pure code: a missed deadline there is a stalled
        // machine, not a hung plugin, and disabling it would stop balancing until a restart.
        if let (Err(Error::Timeout { .. }), Origin::File { .. }) = (&result, &entry.origin) {
            entry.disabled.store(true, Ordering::Relaxed);
            warn!(
                strategy = entry.name,
                deadline_ms = deadline.as_millis() as u64,
                "strategy call missed its deadline; strategy disabled"
            );
        }
        result
    }
}

/// The body of an `Ok` reply, or the error its status stands for.
fn read_status(
    name: &str,
    reply: Result<Reply, chronoshard_plugin_api::abi::CallError>,
) -> Result<Vec<u8>, Error> {
    let name = name.to_string();
    let reply = reply.map_err(|e| Error::BadReply {
        name: name.clone(),
        reason: e.to_string(),
    })?;
    let message = reply.text();
    match reply.status {
        Status::Ok => Ok(reply.body),
        Status::Rejected => Err(Error::Failed { name, message }),
        Status::BadConfig => Err(Error::BadConfig { name, message }),
        Status::BadInput => Err(Error::InputRefused { name, message }),
        Status::Panicked => Err(Error::Panicked { name, message }),
    }
}
