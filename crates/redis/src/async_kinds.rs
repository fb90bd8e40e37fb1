//! [`AsyncRedisScopeKinds`]: the remote keyed kinds of [`RedisScopeKinds`] decided on an
//! [`AsyncRedisScopes`] (feature `tokio`), awaited instead of blocking a thread.
//!
//! [`RedisScopeKinds`]: crate::RedisScopeKinds

use tokengate::scope::{RemoteRefusal, Scope, ScopeKind};

use crate::async_scopes::AsyncRedisScopes;
use crate::error::PoolError;
use crate::policy::RemotePolicy;
use crate::scoped::{Kinds, borrowed, remote_answer};
use crate::strict::StrictScope;

/// The async form of [`RedisScopeKinds`](crate::RedisScopeKinds): the same kinds, keys
/// (`tg:{namespace:tag}:s:kind:scope`), hash tags (the tenant a call names, else the fixed
/// tag) and refusal mapping, so blocking and
/// async instances of one fleet share every bucket. A [`ScopedLimiter`](tokengate::ScopedLimiter)
/// calls its remote store synchronously; an async service awaits
/// [`take`](AsyncRedisScopeKinds::take) itself, after the local scopes admitted (giving
/// them back on a refusal), as `tokengate-tower`'s remote scope does.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tokengate::scope::{Scope, ScopeKind, TenantId};
/// use tokengate_redis::{AsyncRedisScopeKinds, AsyncRedisScopes, PoolConfig, RemotePolicy};
/// let redis = AsyncRedisScopes::connect(PoolConfig::new("redis://127.0.0.1:6379/", "api")).await?;
/// let store = AsyncRedisScopeKinds::new(redis).kind(ScopeKind::Tenant, RemotePolicy::new(1000, 100.0)?)?;
/// let decided = store.take(&[(Scope::Tenant(TenantId(42)), 1)]).await;
/// println!("{decided:?}");
/// # Ok(())
/// # }
/// # let _ = run();
/// ```
#[derive(Debug)]
pub struct AsyncRedisScopeKinds {
    scopes: AsyncRedisScopes,
    kinds: Kinds,
}

impl AsyncRedisScopeKinds {
    /// No kinds yet, on `scopes`, partitioned by tenant, with the fixed hash tag `scopes`
    /// for requests that name no tenant.
    pub fn new(scopes: AsyncRedisScopes) -> Self {
        Self {
            scopes,
            kinds: Kinds::default(),
        }
    }

    /// As [`RedisScopeKinds::unpartitioned`](crate::RedisScopeKinds::unpartitioned):
    /// every call under the fixed tag.
    #[must_use]
    pub fn unpartitioned(mut self) -> Self {
        self.kinds.unpartition();
        self
    }

    /// The Redis key of `scope`'s bucket in a request naming `request`, if its kind is
    /// kept here (as [`RedisScopeKinds::key_in`](crate::RedisScopeKinds::key_in)).
    pub fn key_in(&self, request: &[Scope], scope: &Scope) -> Option<String> {
        let strict = self.strict_scope(scope.kind())?;
        Some(
            self.scopes
                .key(&self.kinds.tag_of(request), strict, &scope.to_string()),
        )
    }

    /// As [`RedisScopeKinds::kind`](crate::RedisScopeKinds::kind).
    ///
    /// # Errors
    ///
    /// [`PoolError::Scope`] for [`ScopeKind::Global`], which stays local.
    pub fn kind(mut self, kind: ScopeKind, policy: RemotePolicy) -> Result<Self, PoolError> {
        self.kinds.keep(kind, policy)?;
        Ok(self)
    }

    /// As [`RedisScopeKinds::with_tag`](crate::RedisScopeKinds::with_tag).
    ///
    /// # Errors
    ///
    /// [`PoolError::Scope`] when `tag` is empty or holds `{` or `}`.
    pub fn with_tag(mut self, tag: &str) -> Result<Self, PoolError> {
        self.kinds.set_tag(tag)?;
        Ok(self)
    }

    /// The Redis client.
    pub fn scopes(&self) -> &AsyncRedisScopes {
        &self.scopes
    }

    /// The strict scope keeping `kind`, if it is kept here.
    pub fn strict_scope(&self, kind: ScopeKind) -> Option<&StrictScope> {
        self.kinds.strict_scope(kind)
    }

    /// Takes each item's cost from its scope, all or none, as
    /// [`RemoteScopes::take`](tokengate::scope::RemoteScopes::take) does for the blocking
    /// client.
    ///
    /// # Errors
    ///
    /// [`RemoteRefusal::Refused`] naming the scope that cannot pay (or one of a kind not
    /// kept here, with [`Duration::MAX`](std::time::Duration::MAX));
    /// [`RemoteRefusal::Unavailable`] when Redis is unreachable under a fail mode that
    /// refuses.
    pub async fn take(&self, items: &[(Scope, u64)]) -> Result<(), RemoteRefusal> {
        if items.is_empty() {
            return Ok(());
        }
        let owned = self.kinds.strict_items(items)?;
        let tag = self.kinds.tag_of_items(items);
        let decided = self.scopes.try_acquire(&tag, &borrowed(&owned)).await;
        remote_answer(decided, items)
    }

    /// Gives back costs taken by [`take`](AsyncRedisScopeKinds::take) and not used (best
    /// effort, as [`RedisScopes::give_back`](crate::RedisScopes::give_back)).
    pub async fn give_back(&self, items: &[(Scope, u64)]) {
        let owned = self.kinds.kept_items(items);
        let tag = self.kinds.tag_of_items(items);
        self.scopes.give_back(&tag, &borrowed(&owned)).await;
    }
}
