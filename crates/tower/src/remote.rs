//! A fleet-wide scope decided in Redis, awaited in the response future (feature `redis`).
//!
//! The layer decides its local scopes first, as always; a request they admit then awaits
//! one strict call ([`AsyncRedisScopes`]) on the remote scope's bucket for the request's
//! key. The tokio worker polls other requests meanwhile: no thread waits on the network.
//! Admitted by the remote scope (or by its fail mode while Redis is unreachable), the
//! request is served; refused, its local tokens are given back and it is answered `429`
//! with `Retry-After`, as a local refusal; unavailable (a fail mode that refuses), the
//! local tokens are given back and it is answered as a remote store that cannot decide
//! (`503`, or served on the local scopes with
//! [`store_unavailable_admits`](crate::RateLimitLayerBuilder::store_unavailable_admits)).

#[cfg(feature = "redis")]
pub use on::RemoteScope;

#[cfg(feature = "redis")]
pub(crate) use on::admitted;

#[cfg(not(feature = "redis"))]
pub(crate) use off::{RemoteScope, admitted};

#[cfg(feature = "redis")]
mod on {
    use std::fmt;
    use std::sync::Arc;

    use bytes::Bytes;
    use http::header::{CONTENT_TYPE, RETRY_AFTER};
    use http::{Request, Response, StatusCode};
    use tokengate::scope::{
        ApiKeyId, ClassId, ClientId, RouteId, Scope, ScopeDecision, ScopeKind, TenantId, UserId,
    };
    use tokengate::{Clock, ScopedLimiter};
    use tokengate_redis::{AsyncRedisScopes, PoolError, RemotePolicy, StrictRefused, StrictScope};
    use tower_service::Service;

    use crate::layer::{LayerError, RateLimitLayerBuilder, Shared};
    use crate::response::{Refused, retry_after_seconds};
    use crate::service::{After, ResponseFuture, plain, store_unavailable};

    /// A scope whose budget the whole fleet shares, kept in Redis and awaited per
    /// request ([`RateLimitLayerBuilder::remote`](crate::RateLimitLayerBuilder::remote)).
    ///
    /// Its bucket for a request is named by the request's key of `kind` (the id the
    /// layer's [`Key`](crate::Key) makes of it, so every instance must hash keys with one
    /// [`key_secret`](crate::RateLimitLayerBuilder::key_secret)), or, for
    /// [`ScopeKind::Global`], one bucket for every request. The cost is the route's work
    /// class's cost in `kind`. A request without a key of `kind` does not pay it, as it
    /// pays no local scope of that kind.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use tokengate::Policy;
    /// use tokengate::scope::{Rule, RuleSet, ScopeKind};
    /// use tokengate_redis::{AsyncRedisScopes, PoolConfig, RemotePolicy};
    /// use tokengate_tower::{Key, RateLimitLayer, RemoteScope};
    ///
    /// let redis = Arc::new(AsyncRedisScopes::connect(PoolConfig::new("redis://127.0.0.1:6379/", "api")).await?);
    /// let limiter = Arc::new(RuleSet::new().rule(ScopeKind::Tenant, Rule::new(Policy::new(50, 10.0)?)).build()?);
    /// let layer = RateLimitLayer::builder(limiter)
    ///     .key(ScopeKind::Tenant, Key::header("x-tenant").required())
    ///     .key_secret(*b"fleet-wide-16-by")
    ///     // 100 requests per second per tenant across the fleet, bursts of 200.
    ///     .remote(RemoteScope::new(redis, ScopeKind::Tenant, RemotePolicy::new(200, 100.0)?)?)
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok(())
    /// # }
    /// # let _ = run();
    /// ```
    #[derive(Clone)]
    pub struct RemoteScope {
        scopes: Arc<AsyncRedisScopes>,
        scope: StrictScope,
        kind: ScopeKind,
    }

    impl fmt::Debug for RemoteScope {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("RemoteScope")
                .field("kind", &self.kind)
                .field("policy", self.scope.policy())
                .finish_non_exhaustive()
        }
    }

    impl RemoteScope {
        /// The scope of `kind` kept in Redis on `scopes`, each key under `policy`: the
        /// strict scope named `remote-<kind>`.
        ///
        /// # Errors
        ///
        /// [`PoolError::Scope`] for a kind that names no key ([`ScopeKind::Route`],
        /// [`ScopeKind::TenantRoute`]).
        pub fn new(
            scopes: Arc<AsyncRedisScopes>,
            kind: ScopeKind,
            policy: RemotePolicy,
        ) -> Result<Self, PoolError> {
            if matches!(kind, ScopeKind::Route | ScopeKind::TenantRoute) {
                return Err(PoolError::Scope(format!(
                    "a remote scope is global or keyed by tenant, user or API key, not {kind}"
                )));
            }
            let scope = scopes.scope(&format!("remote-{}", kind.name()), policy)?;
            Ok(Self {
                scopes,
                scope,
                kind,
            })
        }

        /// The kind whose key names the bucket.
        pub fn kind(&self) -> ScopeKind {
            self.kind
        }

        /// The Redis client.
        pub fn scopes(&self) -> &Arc<AsyncRedisScopes> {
            &self.scopes
        }

        /// Checks the scope against the layer's configuration: a key for its kind, a
        /// fleet-wide key secret, and every class's cost within the remote capacity.
        pub(crate) fn check<C: Clock>(
            &self,
            limiter: &ScopedLimiter<C>,
            classes: impl Iterator<Item = ClassId>,
            keyed: bool,
            shared_secret: bool,
        ) -> Result<(), LayerError> {
            let fail = |m: String| Err(LayerError::Remote(m));
            if self.kind != ScopeKind::Global && !keyed {
                return fail(format!(
                    "the remote {} scope needs a key for {}",
                    self.kind, self.kind
                ));
            }
            if self.kind != ScopeKind::Global && !shared_secret {
                return fail(
                    "a remote keyed scope needs key_secret: every instance must name a \
                     client's bucket alike"
                        .to_owned(),
                );
            }
            let max = self.scope.policy().capacity();
            for class in classes.filter_map(|id| limiter.work_class(id)) {
                let cost = class.cost_in(self.kind);
                if cost > max {
                    return fail(format!(
                        "class {:?} costs {cost} in {}, above the remote capacity {max}",
                        class.name(),
                        self.kind
                    ));
                }
            }
            Ok(())
        }

        /// What an admitted `request` of `class` asks of the remote scope, or `None`
        /// when it pays nothing there (no key of the kind, a class that costs nothing
        /// in it).
        pub(crate) fn plan<C: Clock>(
            &self,
            limiter: &ScopedLimiter<C>,
            request: &tokengate::scope::Request,
            class: ClassId,
        ) -> Option<Planned> {
            let cost = limiter
                .work_class(class)
                .map_or(0, |c| c.cost_in(self.kind));
            let (key, scope) = self.key_of(request).filter(|_| cost > 0)?;
            Some(Planned {
                remote: self.clone(),
                key,
                scope,
                cost,
                route: request.route,
            })
        }

        /// The bucket key (also the call's hash tag) and the scope a refusal names.
        fn key_of(&self, request: &tokengate::scope::Request) -> Option<(String, Scope)> {
            let (id, scope) = match self.kind {
                ScopeKind::Global => return Some(("all".to_owned(), Scope::Global)),
                ScopeKind::Tenant => request
                    .tenant
                    .map(|TenantId(i)| (i, Scope::Tenant(TenantId(i))))?,
                ScopeKind::User => request.user.map(|UserId(i)| (i, Scope::User(UserId(i))))?,
                ScopeKind::ApiKey => request
                    .api_key
                    .map(|ApiKeyId(i)| (i, Scope::ApiKey(ApiKeyId(i))))?,
                ScopeKind::Client => request
                    .client
                    .map(|ClientId(i)| (i, Scope::Client(ClientId(i))))?,
                ScopeKind::Route | ScopeKind::TenantRoute => return None,
            };
            Some((format!("{id:016x}"), scope))
        }
    }

    /// One request's call to the remote scope.
    pub(crate) struct Planned {
        remote: RemoteScope,
        key: String,
        scope: Scope,
        cost: u64,
        route: Option<RouteId>,
    }

    impl<C: Clock> RateLimitLayerBuilder<C> {
        /// Awaits `remote`, a scope the whole fleet shares in Redis, for every request
        /// the local scopes admit ([`RemoteScope`]; feature `redis`). A refusal answers
        /// `429` with `Retry-After` and gives the local tokens back; Redis unreachable
        /// follows the remote client's fail mode, and a refusing one is answered as a
        /// store that cannot decide ([`store_unavailable_admits`](Self::store_unavailable_admits)).
        /// [`build`](Self::build) checks that the kind has a key, that the layer has a
        /// [`key_secret`](Self::key_secret) (a keyed scope), and that no route's class
        /// costs more than the remote capacity, and that no route delays
        /// ([`max_wait`](Self::max_wait)): a delayed request would be served without the
        /// remote decision, so such a layer is [`LayerError::Remote`](crate::LayerError::Remote).
        pub fn remote(mut self, remote: RemoteScope) -> Self {
            self.remote = Some(remote);
            self
        }
    }

    /// An admitted request awaiting its remote scope, then served or refused.
    pub(crate) fn admitted<S, C, ReqBody, ResBody>(
        planned: Planned,
        inner: &mut S,
        shared: &Arc<Shared<C>>,
        req: Request<ReqBody>,
        decision: Option<&ScopeDecision<'_>>,
        after: Option<Box<After<C>>>,
    ) -> ResponseFuture<S::Future, ResBody, S::Error, C>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ReqBody: Send + 'static,
        ResBody: From<Bytes> + Send + 'static,
        C: Clock + Send + Sync + 'static,
    {
        let Planned {
            remote,
            key,
            scope,
            cost,
            route,
        } = planned;
        let charge = decision.and_then(ScopeDecision::charge);
        let shared = Arc::clone(shared);
        // The clone is not ready; the ready one (`poll_ready` was called on it) goes.
        let clone = inner.clone();
        let mut inner = std::mem::replace(inner, clone);
        let fut = async move {
            let decided = remote
                .scopes
                .try_acquire(&key, &[(&remote.scope, &key, cost)])
                .await;
            let give_back_local = || {
                if let Some(charge) = &charge {
                    shared.limiter.refund(charge);
                }
            };
            match decided {
                Ok(_) => {}
                Err(StrictRefused::Rejected { retry_after, .. }) => {
                    give_back_local();
                    let retry_after = retry_after_seconds(retry_after);
                    let refused = Refused {
                        scope,
                        retry_after: Some(retry_after),
                        cost,
                        route,
                    };
                    let (content_type, body) = (shared.refusal_body)(&refused);
                    let mut r = plain(StatusCode::TOO_MANY_REQUESTS);
                    *r.body_mut() = ResBody::from(body);
                    r.headers_mut().insert(CONTENT_TYPE, content_type);
                    r.headers_mut().insert(RETRY_AFTER, retry_after.into());
                    return Ok(r);
                }
                Err(StrictRefused::Unavailable { retry_after }) => {
                    shared.counts.store_unavailable();
                    if !shared.store_down_admits {
                        give_back_local();
                        return Ok(store_unavailable(retry_after));
                    }
                }
                // Checked at build: a class never costs more than the remote capacity.
                Err(StrictRefused::Invalid(_)) => {
                    give_back_local();
                    return Ok(plain(StatusCode::INTERNAL_SERVER_ERROR));
                }
            }
            let mut response = inner.call(req).await?;
            if let Some(after) = after {
                (*after).apply(&mut response);
            }
            Ok(response)
        };
        ResponseFuture::boxed(Box::pin(fut))
    }
}

#[cfg(not(feature = "redis"))]
mod off {
    use tokengate::scope::ScopeKind;

    use crate::layer::LayerError;

    /// No remote scope without the `redis` feature.
    #[derive(Clone, Debug)]
    pub(crate) enum RemoteScope {}

    /// Never made.
    pub(crate) enum Planned {}

    /// Never called (there is no scope to call them on): they take what the layer
    /// passes whatever its type, so only the `redis` build spells out the signatures.
    impl RemoteScope {
        pub(crate) fn kind(&self) -> ScopeKind {
            match *self {}
        }

        pub(crate) fn check<L, I>(&self, _: L, _: I, _: bool, _: bool) -> Result<(), LayerError> {
            match *self {}
        }

        pub(crate) fn plan<L, Q, K>(&self, _: L, _: Q, _: K) -> Option<Planned> {
            match *self {}
        }
    }

    /// Never called: there is no [`Planned`] to pass. Generic over what the caller
    /// passes on (the service, the layer's state, the request, the decision and the
    /// admission's after-hook) and over the future it returns, so that the remote
    /// scope's wiring is written once, in the `redis` build.
    pub(crate) fn admitted<S, L, Q, D, A, F>(planned: Planned, _: S, _: L, _: Q, _: D, _: A) -> F {
        match planned {}
    }
}
