//! Live reload: a watcher on the file's directory, debounced, that validates the new file
//! and publishes it atomically, or keeps the running configuration and says why.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use arc_swap::ArcSwap;
use notify::{EventKind, RecursiveMode, Watcher as _};

use tokengate::Clock;
use tokengate::scope::{ScopeReconfigured, ScopedLimiter};

use crate::error::{ConfigError, Problem, ProblemKind};
use crate::model::Config;

/// What a reload did, as subscribers see it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ReloadEvent {
    /// A new valid configuration was published; readers see `current` from now on.
    Applied {
        /// The configuration it replaced.
        previous: Arc<Config>,
        /// The configuration now published.
        current: Arc<Config>,
    },
    /// The file changed but could not be read or is invalid: the running configuration
    /// stays published, unchanged.
    Rejected(ConfigError),
}

/// Why a watch could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum WatchError {
    /// The file is missing or invalid at start: there is no configuration to run.
    Config(ConfigError),
    /// The directory could not be watched (the watcher's message).
    Watch(String),
}

impl fmt::Display for WatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchError::Config(e) => e.fmt(f),
            WatchError::Watch(m) => write!(f, "cannot watch the configuration: {m}"),
        }
    }
}

impl std::error::Error for WatchError {}

type Subscriber = Box<dyn Fn(&ReloadEvent) + Send>;

/// A running limiter a reload is applied to ([`ConfigWatcher::apply_to`]).
trait Apply: Send {
    /// Why `config` cannot replace the running configuration in place, if it cannot.
    fn check(&self, config: &Config) -> Result<(), String>;
    /// Switches the limiter to `config` (checked).
    fn apply(&self, config: &Config) -> Result<ScopeReconfigured, String>;
}

struct Limiter<C: Clock, S>(Arc<ScopedLimiter<C, S>>);

impl<C, S> Apply for Limiter<C, S>
where
    C: Clock + Clone + Send + Sync + 'static,
    S: std::hash::BuildHasher + Clone + Send + Sync + 'static,
{
    fn check(&self, config: &Config) -> Result<(), String> {
        let rules = config.rule_set().map_err(|e| e.to_string())?;
        self.0.check_reconfigure(&rules).map_err(|e| e.to_string())
    }

    fn apply(&self, config: &Config) -> Result<ScopeReconfigured, String> {
        let rules = config.rule_set().map_err(|e| e.to_string())?;
        self.0.reconfigure(rules).map_err(|e| e.to_string())
    }
}

/// The state reloads share: one at a time, in order.
struct Reloader {
    path: PathBuf,
    current: Arc<ArcSwap<Config>>,
    inner: Mutex<Inner>,
}

struct Inner {
    /// The text of the published configuration.
    text: String,
    /// Whether the last attempt was rejected (then the same text is published again
    /// when it comes back, so subscribers hear that the file is good again).
    rejected: bool,
    subscribers: Vec<Subscriber>,
    /// The running limiters each reload is applied to, all or none.
    appliers: Vec<Box<dyn Apply>>,
}

impl Reloader {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A subscriber that panicked leaves nothing half-done here: keep going.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `config` to every running limiter, in order. One that refuses it (what
    /// its check cannot see: the keys a tier change moves back must fit the rule's map
    /// as it is now) changes nothing there; those before it are switched back to the
    /// running configuration (a second switch, carrying tokens with its strategies
    /// again), and the file is refused.
    fn apply(&self, appliers: &[Box<dyn Apply>], config: &Config) -> Result<(), ConfigError> {
        for (i, a) in appliers.iter().enumerate() {
            match a.apply(config) {
                Ok(done) => tracing::info!(
                    file = %self.path.display(),
                    reconfigurations = done.reconfigurations,
                    maps = done.maps,
                    "configuration applied to the running limiter"
                ),
                Err(why) => {
                    let running = self.current.load_full();
                    for earlier in &appliers[..i] {
                        if let Err(e) = earlier.apply(&running) {
                            tracing::error!(
                                file = %self.path.display(),
                                error = %e,
                                "a running limiter could not be switched back"
                            );
                        }
                    }
                    return Err(ConfigError::Invalid {
                        file: self.path.clone(),
                        problems: vec![Problem {
                            location: None,
                            field: String::new(),
                            kind: ProblemKind::Engine(why),
                        }],
                    });
                }
            }
        }
        Ok(())
    }

    /// Reads, validates and publishes the file; tells subscribers. `Ok(false)` when
    /// the text is the one published and nothing was rejected since.
    fn reload(&self) -> Result<bool, ConfigError> {
        let mut inner = self.lock();
        let outcome = std::fs::read_to_string(&self.path)
            .map_err(|e| ConfigError::io(&self.path, &e))
            .and_then(|text| {
                if text == inner.text && !inner.rejected {
                    return Ok(None);
                }
                Config::from_toml_named(&text, &self.path).map(|c| Some((text, c)))
            })
            .and_then(|new| match &new {
                // Every running limiter must take the file in place, or none is changed
                // and the file is refused.
                Some((_, config)) => {
                    let frozen = crate::redis::not_live(&self.current.load(), config);
                    if !frozen.is_empty() {
                        return Err(ConfigError::Invalid {
                            file: self.path.clone(),
                            problems: frozen
                                .into_iter()
                                .map(|field| Problem {
                                    location: None,
                                    field: field.clone(),
                                    kind: ProblemKind::NotLive(field),
                                })
                                .collect(),
                        });
                    }
                    match inner.appliers.iter().find_map(|a| a.check(config).err()) {
                        None => Ok(new),
                        Some(why) => Err(ConfigError::Invalid {
                            file: self.path.clone(),
                            problems: vec![Problem {
                                location: None,
                                field: String::new(),
                                kind: ProblemKind::Engine(why),
                            }],
                        }),
                    }
                }
                None => Ok(new),
            });
        let event = match outcome {
            Ok(None) => return Ok(false),
            Ok(Some((text, config))) => match self.apply(&inner.appliers, &config) {
                Ok(()) => {
                    let current = Arc::new(config);
                    let previous = self.current.swap(Arc::clone(&current));
                    inner.text = text;
                    inner.rejected = false;
                    ReloadEvent::Applied { previous, current }
                }
                Err(e) => {
                    tracing::warn!(
                        file = %self.path.display(),
                        error = %e,
                        "configuration refused by a running limiter; the running one stays"
                    );
                    inner.rejected = true;
                    ReloadEvent::Rejected(e)
                }
            },
            Err(e) => {
                tracing::warn!(
                    file = %self.path.display(),
                    error = %e,
                    "configuration rejected; the running one stays"
                );
                inner.rejected = true;
                ReloadEvent::Rejected(e)
            }
        };
        for s in &inner.subscribers {
            s(&event);
        }
        match event {
            ReloadEvent::Rejected(e) => Err(e),
            ReloadEvent::Applied { .. } => Ok(true),
        }
    }
}

enum Message {
    Changed,
    Stop,
}

/// How a [`ConfigWatcher`] waits for a file to settle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchOptions {
    debounce: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            debounce: Duration::from_millis(200),
        }
    }
}

impl WatchOptions {
    /// The defaults: a debounce of 200 ms.
    pub fn new() -> WatchOptions {
        WatchOptions::default()
    }

    /// Reloads once no change has been seen for `quiet` (200 ms by default): an editor's
    /// save (truncate, write, rename) is read once, whole.
    pub fn debounce(mut self, quiet: Duration) -> WatchOptions {
        self.debounce = quiet;
        self
    }
}

/// Watches a configuration file and publishes each valid new version atomically.
///
/// The directory is watched, not the file: editors save by writing a new file and
/// renaming it over the old one, and a deleted file may come back. Changes are
/// debounced; then the file is read and validated whole. A valid file is published with
/// one atomic pointer swap (readers of [`current`](ConfigWatcher::current) or of the
/// [`ArcSwap`] from [`shared`](ConfigWatcher::shared) see the old configuration or the
/// new one, never a mix) and subscribers get [`ReloadEvent::Applied`]; an invalid,
/// unreadable or deleted file leaves the running configuration in place, logs a
/// `tracing` warning and gives subscribers [`ReloadEvent::Rejected`] with the typed
/// error.
///
/// Subscribers run on the watcher's thread, one event at a time and in order; an
/// engine-side applier attaches here. A subscriber must not call
/// [`reload_now`](ConfigWatcher::reload_now) (it would wait for itself).
///
/// Dropping the watcher stops it.
pub struct ConfigWatcher {
    reloader: Arc<Reloader>,
    sender: Sender<Message>,
    // Declared before the thread: dropped first, so no event arrives after `Stop`.
    watcher: Option<notify::RecommendedWatcher>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for ConfigWatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigWatcher")
            .field("path", &self.reloader.path)
            .finish_non_exhaustive()
    }
}

impl ConfigWatcher {
    /// Loads `path` (which must be valid) and starts watching its directory.
    ///
    /// # Errors
    ///
    /// [`WatchError::Config`] when the file is missing or invalid, [`WatchError::Watch`]
    /// when its directory cannot be watched.
    pub fn start(
        path: impl AsRef<Path>,
        options: WatchOptions,
    ) -> Result<ConfigWatcher, WatchError> {
        let path = path.as_ref().to_path_buf();
        let text = std::fs::read_to_string(&path)
            .map_err(|e| WatchError::Config(ConfigError::io(&path, &e)))?;
        let config = Config::from_toml_named(&text, &path).map_err(WatchError::Config)?;
        let reloader = Arc::new(Reloader {
            current: Arc::new(ArcSwap::from_pointee(config)),
            inner: Mutex::new(Inner {
                text,
                rejected: false,
                subscribers: Vec::new(),
                appliers: Vec::new(),
            }),
            path,
        });
        let dir = match reloader.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = reloader.path.file_name().map(ToOwned::to_owned);
        let (sender, receiver) = mpsc::channel();
        let events = sender.clone();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let relevant = match event {
                    // Reading the file (ours included) is no change.
                    Ok(e) if matches!(e.kind, EventKind::Access(_)) => false,
                    Ok(e) => e.paths.iter().any(|p| p.file_name() == name.as_deref()),
                    // An overflowed queue may have lost our file's event: look again.
                    Err(_) => true,
                };
                if relevant {
                    let _ = events.send(Message::Changed);
                }
            })
            .map_err(|e| WatchError::Watch(e.to_string()))?;
        watcher
            .watch(&dir, RecursiveMode::NonRecursive)
            .map_err(|e| WatchError::Watch(e.to_string()))?;
        let debounce = options.debounce;
        let worker = Arc::clone(&reloader);
        let thread = std::thread::Builder::new()
            .name("tokengate-config".into())
            .spawn(move || {
                while let Ok(Message::Changed) = receiver.recv() {
                    loop {
                        match receiver.recv_timeout(debounce) {
                            Ok(Message::Changed) => continue,
                            Ok(Message::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                            Err(RecvTimeoutError::Timeout) => break,
                        }
                    }
                    // Published or rejected, subscribers have been told.
                    let _ = worker.reload();
                }
            })
            .map_err(|e| WatchError::Watch(e.to_string()))?;
        Ok(ConfigWatcher {
            reloader,
            sender,
            watcher: Some(watcher),
            thread: Some(thread),
        })
    }

    /// The configuration published now.
    pub fn current(&self) -> Arc<Config> {
        self.reloader.current.load_full()
    }

    /// The published configuration's cell, for readers on a hot path
    /// (`shared.load()` costs no reference count).
    pub fn shared(&self) -> Arc<ArcSwap<Config>> {
        Arc::clone(&self.reloader.current)
    }

    /// The file watched.
    pub fn path(&self) -> &Path {
        &self.reloader.path
    }

    /// Calls `f` with every later reload's outcome, on the watcher's thread.
    pub fn subscribe(&self, f: impl Fn(&ReloadEvent) + Send + 'static) {
        self.reloader.lock().subscribers.push(Box::new(f));
    }

    /// Applies every later reload to `limiter` (built from this watcher's
    /// configuration, [`Config::rule_set`]): its policies, tiers, overrides and class
    /// costs are switched in place ([`ScopedLimiter::reconfigure`]), each rule's
    /// buckets carrying their tokens over with the rule's `inheritance` (a key whose
    /// tier changes too). A file the limiter cannot take in place (another shape: a rule
    /// added or removed, new map bounds or classes; or keys leaving their tiers that do
    /// not fit the rule's map; see [`tokengate::scope::Reshape`]) is refused like an
    /// invalid file: the running configuration stays published and applied, a warning
    /// is logged, and subscribers get [`ReloadEvent::Rejected`] with a
    /// [`ProblemKind::Engine`] problem saying why. With several limiters, a file is
    /// applied to all or to none: each is checked first, and should one still refuse
    /// it (room is known only while its switch holds its maps), those that took it are
    /// switched back to the running configuration (a second switch, carrying tokens
    /// with its strategies again).
    pub fn apply_to<C, S>(&self, limiter: Arc<ScopedLimiter<C, S>>)
    where
        C: Clock + Clone + Send + Sync + 'static,
        S: std::hash::BuildHasher + Clone + Send + Sync + 'static,
    {
        self.reloader
            .lock()
            .appliers
            .push(Box::new(Limiter(limiter)));
    }

    /// Reloads now, without waiting for a change (for a signal handler or an admin
    /// endpoint). `Ok(true)` when a new configuration was published, `Ok(false)` when the
    /// file is the one running.
    ///
    /// # Errors
    ///
    /// The [`ConfigError`] when the file is unreadable or invalid; the running
    /// configuration stays.
    pub fn reload_now(&self) -> Result<bool, ConfigError> {
        self.reloader.reload()
    }
}

impl Drop for ConfigWatcher {
    fn drop(&mut self) {
        drop(self.watcher.take());
        let _ = self.sender.send(Message::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
