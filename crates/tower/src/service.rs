//! The service: decide, then answer 429, wait, or call the inner service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tokengate::owned::OwnedReservation;
use tokengate::scope::{
    Charge, PerKind, RouteId, Scope, ScopeDecision, ScopeError, ScopeKind, ScopeVerdict,
};
use tokengate::{Clock, QuantaClock, ScopedLimiter};
use tower_service::Service;

use crate::key::{Head, KeyError, KeyPlan, peer_ip, set_key_id};
use crate::layer::{CompiledRoute, Options, Shared};
use crate::response::{Fields, Item, MissingKey, PROBLEM_JSON, Refused, retry_after_seconds};
use crate::route::StatusPredicate;

/// The service a [`RateLimitLayer`](crate::RateLimitLayer) wraps around `S`.
pub struct RateLimit<S, C: Clock = QuantaClock> {
    pub(crate) inner: S,
    pub(crate) shared: Arc<Shared<C>>,
}

impl<S: Clone, C: Clock> Clone for RateLimit<S, C> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, C: Clock> fmt::Debug for RateLimit<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

type BoxFuture<B, E> = Pin<Box<dyn Future<Output = Result<Response<B>, E>> + Send>>;

pin_project! {
    /// The response future of [`RateLimit`].
    pub struct ResponseFuture<F, B, E, C: Clock> {
        #[pin]
        state: State<F, B, E>,
        // What an admission with fields or a refund does to the inner future's
        // response (boxed: the future stays small to move); `None` for every other.
        after: Option<Box<After<C>>>,
    }
}

pin_project! {
    // Three states, so that telling the admission's from the others is one comparison;
    // an admission without fields or refund is the inner future and an empty `after`,
    // polled through with nothing else to do.
    #[project = StateProj]
    enum State<F, B, E> {
        Inner { #[pin] fut: F },
        Ready { response: Option<Response<B>> },
        Waiting { fut: BoxFuture<B, E> },
    }
}

impl<F, B, E, C: Clock> ResponseFuture<F, B, E, C> {
    #[inline(always)]
    fn new(state: State<F, B, E>) -> Self {
        ResponseFuture { state, after: None }
    }

    /// A response future that runs `fut` (the remote scope's wait, then the service).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn boxed(fut: BoxFuture<B, E>) -> Self {
        Self::new(State::Waiting { fut })
    }

    /// The inner service's future, with what the admission does to its response.
    #[inline(always)]
    fn inner(fut: F, after: Option<Box<After<C>>>) -> Self {
        ResponseFuture {
            state: State::Inner { fut },
            after,
        }
    }
}

impl<F, B, E, C: Clock> fmt::Debug for ResponseFuture<F, B, E, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// What an admitted request does to its response: rate-limit fields, refund on status.
pub(crate) struct After<C: Clock> {
    fields: Fields,
    refund: Option<(Charge, StatusPredicate, Arc<Shared<C>>)>,
}

impl<C: Clock> After<C> {
    pub(crate) fn apply<B>(self, response: &mut Response<B>) {
        if let Some((charge, refund, shared)) = &self.refund {
            if refund(response.status()) {
                shared.limiter.refund(charge);
                shared.counts.refunded();
            }
        }
        self.fields.write(response.headers_mut());
    }
}

impl<F, B, E, C> Future for ResponseFuture<F, B, E, C>
where
    F: Future<Output = Result<Response<B>, E>>,
    C: Clock,
{
    type Output = Result<Response<B>, E>;

    // The admission's path (the inner future alone) inline where the future is polled;
    // every other state, and an admission's `after`, out of line.
    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            StateProj::Inner { fut } if this.after.is_none() => fut.poll(cx),
            state => poll_other(state, this.after, cx),
        }
    }
}

/// [`ResponseFuture::poll`] in every state but `Inner` without `after`.
#[inline(never)]
fn poll_other<F, B, E, C>(
    state: StateProj<'_, F, B, E>,
    after: &mut Option<Box<After<C>>>,
    cx: &mut Context<'_>,
) -> Poll<Result<Response<B>, E>>
where
    F: Future<Output = Result<Response<B>, E>>,
    C: Clock,
{
    match state {
        StateProj::Inner { fut } => {
            let mut response = ready!(fut.poll(cx))?;
            if let Some(after) = after.take() {
                (*after).apply(&mut response);
            }
            Poll::Ready(Ok(response))
        }
        StateProj::Ready { response } => Poll::Ready(Ok(response
            .take()
            .expect("ResponseFuture polled after completion"))),
        StateProj::Waiting { fut } => fut.as_mut().poll(cx),
    }
}

impl<S, C, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<Bytes> + Send + 'static,
    C: Clock + Send + Sync + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    // Inline where the service is called: the common admission (no route list, the
    // small verdict, no admitted fields) is this function alone, the request moved once,
    // into the inner service; everything else is out of line.
    #[inline(always)]
    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let s = &*self.shared;
        // No route listed (the one-line constructors): every request is the fallback's,
        // with nothing to match.
        let matched = if s.routes.is_empty() {
            &s.fallback
        } else {
            matched_route(s, &req)
        };
        let mut request = tokengate::scope::Request::new();
        request.route = matched.id;
        match &s.key_plan {
            KeyPlan::None => {}
            // The client's address, no trusted proxy: the peer is the client.
            KeyPlan::Peer { kind, masks } => match peer_ip(req.extensions()) {
                Some(peer) => {
                    set_key_id(&mut request, *kind, s.hasher.peer(peer, masks));
                }
                // No peer address: the server does not record it. Skipping the scope
                // would serve every client unlimited; refuse loudly instead.
                None => return ready(no_peer_address(s, *kind)),
            },
            KeyPlan::Keys => {
                if let Err(refused) = key_ids(s, &req, &mut request) {
                    return refused;
                }
            }
        }
        // The small verdict for a request no one reads the scopes of; the whole decision
        // for a shadowed kind (decided again without it), the admitted fields of several
        // scopes (one scope's are the verdict's), a refund (its charge), or the decision
        // records.
        if !matched.whole && !tracing_on() {
            let verdict = s
                .limiter
                .try_acquire_verdict(&request, matched.options.class);
            if let Ok(v) = &verdict {
                // An admission: the inner service's future, the request moved once, into
                // it (a remote scope to await takes the whole decision, so there is none
                // here).
                if v.is_admitted() && !s.admitted_fields {
                    near_limit(s, v);
                    return ResponseFuture::new(State::Inner {
                        fut: self.inner.call(req),
                    });
                }
            }
            return on_verdict(
                &mut self.inner,
                &self.shared,
                req,
                &request,
                matched,
                verdict,
            );
        }
        on_decision(&mut self.inner, &self.shared, req, &request, matched, false)
    }
}

/// The first route `req` matches, else the fallback.
#[inline(never)]
fn matched_route<'a, C: Clock, B>(s: &'a Shared<C>, req: &Request<B>) -> &'a CompiledRoute {
    s.routes
        .iter()
        .find(|r| r.route.matches(req.method(), req.uri().path()))
        .unwrap_or(&s.fallback)
}

/// Puts the configured keys' ids in `request`, in kind order: `Err` is the answer to a
/// request without a required key.
#[inline(never)]
fn key_ids<F, B: From<Bytes>, E, C: Clock, ReqBody>(
    s: &Shared<C>,
    req: &Request<ReqBody>,
    request: &mut tokengate::scope::Request,
) -> Result<(), ResponseFuture<F, B, E, C>> {
    let head = Head {
        method: req.method(),
        uri: req.uri(),
        headers: req.headers(),
        extensions: req.extensions(),
    };
    for (kind, key) in &s.keyed {
        let kind = *kind;
        let id = match key.extract(&head, &s.proxies, &s.hasher) {
            Ok(Some(id)) => id,
            // No peer address: the server does not record it. Skipping the scope would
            // serve every client unlimited; refuse loudly instead.
            Ok(None) if key.is_client_ip() => return Err(ready(no_peer_address(s, kind))),
            Ok(None) if !key.is_required() => continue,
            Ok(None) => return Err(missing(s, kind, KeyError::Absent)),
            Err(e) => return Err(missing(s, kind, e)),
        };
        // Keys are only configured for the kinds that take one (checked at build).
        set_key_id(request, kind, id);
    }
    Ok(())
}

/// Acts on the small verdict of every request but the common admission: the admitted
/// fields, a refusal, a wait, or the store's unavailability (then the whole decision on
/// the local scopes, when the layer serves without the store).
#[inline(never)]
fn on_verdict<S, C, ReqBody, ResBody>(
    inner: &mut S,
    shared: &Arc<Shared<C>>,
    req: Request<ReqBody>,
    request: &tokengate::scope::Request,
    matched: &CompiledRoute,
    verdict: Result<ScopeVerdict<'_>, ScopeError>,
) -> ResponseFuture<S::Future, ResBody, S::Error, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<Bytes> + Send + 'static,
    C: Clock + Send + Sync + 'static,
{
    let s = &**shared;
    match verdict {
        Ok(v) if v.is_admitted() => {
            near_limit(s, &v);
            let after = if s.admitted_fields {
                admitted_alone(s, &v).map(Box::new)
            } else {
                None
            };
            call_inner(inner, req, after)
        }
        Ok(v) => answer(
            inner,
            shared,
            req,
            request,
            matched.id,
            &matched.options,
            &v,
            None,
        ),
        Err(ScopeError::RemoteUnavailable { retry_after }) => {
            s.counts.store_unavailable();
            if !s.store_down_admits {
                return ready(store_unavailable(retry_after));
            }
            on_decision(inner, shared, req, request, matched, true)
        }
        Err(_) => ready(plain(StatusCode::INTERNAL_SERVER_ERROR)),
    }
}

/// Takes the whole decision ([`decide`]) and acts on it.
#[inline(never)]
fn on_decision<S, C, ReqBody, ResBody>(
    inner: &mut S,
    shared: &Arc<Shared<C>>,
    req: Request<ReqBody>,
    request: &tokengate::scope::Request,
    matched: &CompiledRoute,
    remote_down: bool,
) -> ResponseFuture<S::Future, ResBody, S::Error, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<Bytes> + Send + 'static,
    C: Clock + Send + Sync + 'static,
{
    let options = &matched.options;
    let decision = match decide(shared, request, options, remote_down) {
        Ok(d) => d,
        Err(response) => return ready(response),
    };
    let v = decision.verdict();
    answer(
        inner,
        shared,
        req,
        request,
        matched.id,
        options,
        &v,
        Some(&decision),
    )
}

/// Whether the decision records are wanted (a `tracing` subscriber at `DEBUG` for the
/// engine's target): a cached check.
#[inline(always)]
fn tracing_on() -> bool {
    #[cfg(feature = "tracing")]
    {
        tracing::enabled!(target: tokengate::telemetry::trace::TARGET, tracing::Level::DEBUG)
    }
    #[cfg(not(feature = "tracing"))]
    {
        false
    }
}

/// The whole decision: paid again without a shadowed kind that refused, and, with
/// `remote_down` (the store could not decide and the layer serves on the local scopes),
/// without the remote kinds. `Err` is the answer when there is no decision to act on.
fn decide<'a, B: From<Bytes>, C: Clock>(
    s: &'a Shared<C>,
    request: &tokengate::scope::Request,
    options: &Options,
    mut remote_down: bool,
) -> Result<ScopeDecision<'a>, Response<B>> {
    let limiter = &s.limiter;
    let mut skip: PerKind<ScopeKind> = [ScopeKind::Global; ScopeKind::COUNT];
    let mut skipped = 0;
    let mut remote_skipped = false;
    loop {
        if remote_down && !remote_skipped {
            // Served on the local scopes alone: paid again without the remote kinds
            // (which then cannot be unavailable).
            remote_skipped = true;
            for kind in limiter.remote_kinds() {
                if !skip[..skipped].contains(&kind) {
                    skip[skipped] = kind;
                    skipped += 1;
                }
            }
        }
        let d = if skipped == 0 {
            limiter.try_acquire(request, options.class)
        } else {
            limiter.try_acquire_without(request, options.class, &skip[..skipped])
        };
        let d = match d {
            Ok(d) => d,
            Err(ScopeError::RemoteUnavailable { retry_after }) => {
                s.counts.store_unavailable();
                if s.store_down_admits && !remote_skipped {
                    remote_down = true;
                    continue;
                }
                return Err(store_unavailable(retry_after));
            }
            Err(_) => return Err(plain(StatusCode::INTERNAL_SERVER_ERROR)),
        };
        #[cfg(feature = "tracing")]
        d.trace();
        match d.refused_scope().map(|sc| sc.kind()) {
            Some(kind) if s.shadow_kinds.contains(&kind) && !skip[..skipped].contains(&kind) => {
                shadow_refusal(s, request, &d.verdict());
                skip[skipped] = kind;
                skipped += 1;
            }
            _ => return Ok(d),
        }
    }
}

/// Acts on a verdict: serves the request (with its fields and refund when `decision`
/// is there to give them), delays it, or answers the refusal. Out of line: the common
/// admission is served in [`RateLimit::call`] itself.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn answer<S, C, ReqBody, ResBody>(
    inner: &mut S,
    shared: &Arc<Shared<C>>,
    req: Request<ReqBody>,
    request: &tokengate::scope::Request,
    route: Option<RouteId>,
    options: &Options,
    v: &ScopeVerdict<'_>,
    decision: Option<&ScopeDecision<'_>>,
) -> ResponseFuture<S::Future, ResBody, S::Error, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<Bytes> + Send + 'static,
    C: Clock + Send + Sync + 'static,
{
    let s = &**shared;
    if v.is_admitted() {
        near_limit(s, v);
        let after = match decision {
            Some(d) if s.admitted_fields || options.refund.is_some() => {
                Some(Box::new(admitted(shared, d, options)))
            }
            // One scope kind has a quota: its fields are the tightest scope's.
            None if s.admitted_fields => admitted_alone(s, v).map(Box::new),
            _ => None,
        };
        if let Some(planned) = s
            .remote
            .as_ref()
            .and_then(|r| r.plan(&s.limiter, request, options.class))
        {
            return crate::remote::admitted(planned, inner, shared, req, decision, after);
        }
        return call_inner(inner, req, after);
    }
    if options.shadow {
        shadow_refusal(s, request, v);
        return call_inner(inner, req, None);
    }
    let within = v
        .retry_after()
        .is_some_and(|w| !options.max_wait.is_zero() && w <= options.max_wait);
    if within {
        if let Ok(reservation) = s
            .limiter
            .reserve_owned(request, options.class, options.max_wait)
        {
            let refund = options.refund.clone();
            return wait(inner, Arc::clone(shared), req, reservation, refund);
        }
    }
    if v.is_key_limit() {
        return ready(key_limit(s, v));
    }
    ready(refusal(s, request, v, route))
}

/// Counts an admission that left its tightest scope below a tenth of its quota.
#[inline(always)]
fn near_limit<C: Clock>(s: &Shared<C>, v: &ScopeVerdict<'_>) {
    let Some(kind) = v.tightest() else {
        return;
    };
    if v.remaining() < s.quotas.near[kind] {
        s.counts.near_limit(kind);
    }
}

#[inline(always)]
fn call_inner<S, C, ReqBody, ResBody>(
    inner: &mut S,
    req: Request<ReqBody>,
    after: Option<Box<After<C>>>,
) -> ResponseFuture<S::Future, ResBody, S::Error, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Send + 'static,
    C: Clock + Send + Sync + 'static,
{
    ResponseFuture::inner(inner.call(req), after)
}

/// Delay mode: sleeps on the runtime's timer for the reservation, then calls the
/// inner service. Dropping the future before then (the client hung up) drops the
/// reservation, which gives every scope its tokens back.
fn wait<S, C, ReqBody, ResBody>(
    inner: &mut S,
    shared: Arc<Shared<C>>,
    req: Request<ReqBody>,
    reservation: OwnedReservation<ScopedLimiter<C>>,
    refund: Option<StatusPredicate>,
) -> ResponseFuture<S::Future, ResBody, S::Error, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    C: Clock + Send + Sync + 'static,
{
    // The clone is not ready; the ready one (`poll_ready` was called on it) goes.
    let clone = inner.clone();
    let mut inner = std::mem::replace(inner, clone);
    let fut = async move {
        let watch = CancelWatch(Some(Arc::clone(&shared)));
        let charge = reservation.ready(tokio::time::sleep).await;
        watch.disarm();
        shared.counts.delayed();
        let response = inner.call(req).await?;
        if refund.is_some_and(|r| r(response.status())) {
            shared.limiter.refund(&charge);
            shared.counts.refunded();
        }
        Ok(response)
    };
    ResponseFuture::new(State::Waiting { fut: Box::pin(fut) })
}

/// Counts a delayed request dropped before its time.
struct CancelWatch<C: Clock>(Option<Arc<Shared<C>>>);

impl<C: Clock> CancelWatch<C> {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl<C: Clock> Drop for CancelWatch<C> {
    fn drop(&mut self) {
        if let Some(s) = &self.0 {
            s.counts.delay_cancelled();
        }
    }
}

fn ready<F, B, E, C: Clock>(response: Response<B>) -> ResponseFuture<F, B, E, C> {
    ResponseFuture::new(State::Ready {
        response: Some(response),
    })
}

/// 503 with `Retry-After` ([`retry_after_seconds`]) and a problem-details
/// body: the limiter's remote store cannot decide now.
pub(crate) fn store_unavailable<B: From<Bytes>>(retry_after: Duration) -> Response<B> {
    let secs = retry_after_seconds(retry_after);
    let body = format!(
        r#"{{"type":"about:blank","status":503,"detail":"the rate limit store is unavailable; retry after {secs} s"}}"#
    );
    let mut r = plain(StatusCode::SERVICE_UNAVAILABLE);
    *r.body_mut() = B::from(Bytes::from(body));
    let headers = r.headers_mut();
    headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    r
}

/// 503 with `Retry-After` and a problem-details body: the refusing scope's key map is
/// full of keys still in use, so the limiter has no room to track this client.
///
/// Not a 429: the client has not spent a quota (its key has no bucket), so there are no
/// `RateLimit` fields to report, and the cause is the server's capacity, which a 503
/// names (and which monitoring treats as the server's, not the client's). The wait is
/// the kind's window: the time an emptied bucket takes to fill, after which any key idle
/// since the refusal is full and can be released to make room (an upper bound on the
/// earliest room, met as soon as any one client goes quiet).
fn key_limit<B: From<Bytes>, C: Clock>(s: &Shared<C>, v: &ScopeVerdict<'_>) -> Response<B> {
    let kind = v.refused().unwrap_or(ScopeKind::Global);
    s.counts.key_limit(kind);
    let secs = s.quotas.by_kind[kind]
        .as_ref()
        .map_or(1, |q| q.window_seconds());
    let body = format!(
        r#"{{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"the rate limiter holds as many {kind} keys as it may; retry after {secs} s"}}"#
    );
    let mut r = plain(StatusCode::SERVICE_UNAVAILABLE);
    *r.body_mut() = B::from(Bytes::from(body));
    let headers = r.headers_mut();
    headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    headers.insert(CONTENT_TYPE, PROBLEM_JSON);
    r
}

/// 500 with a problem-details body: a client-address key found no peer address. Logged
/// at `ERROR` the first time (the cause, the server's set-up, is the same for every
/// request), counted every time.
fn no_peer_address<B: From<Bytes>, C: Clock>(s: &Shared<C>, kind: ScopeKind) -> Response<B> {
    let first = s.counts.no_peer_address(kind);
    #[cfg(feature = "tracing")]
    if first {
        tracing::error!(
            target: "tokengate::edge",
            scope_kind = %kind,
            "the {kind} scope is keyed by the client's address, but the request carries no \
             peer address: serve with `into_make_service_with_connect_info::<SocketAddr>()` \
             (or put a SocketAddr in the request extensions); answering 500"
        );
    }
    #[cfg(not(feature = "tracing"))]
    let _ = first;
    let body = r#"{"type":"about:blank","title":"Internal Server Error","status":500,"detail":"the rate limiter cannot identify the client"}"#;
    let mut r = plain(StatusCode::INTERNAL_SERVER_ERROR);
    *r.body_mut() = B::from(Bytes::from_static(body.as_bytes()));
    r.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
    r
}

pub(crate) fn plain<B: From<Bytes>>(status: StatusCode) -> Response<B> {
    let mut r = Response::new(B::from(Bytes::new()));
    *r.status_mut() = status;
    r
}

fn missing<F, B: From<Bytes>, E, C: Clock>(
    s: &Shared<C>,
    kind: ScopeKind,
    error: KeyError,
) -> ResponseFuture<F, B, E, C> {
    s.counts.missing_key(kind);
    let (status, (content_type, body)) = (s.missing)(&MissingKey { kind, error });
    let mut r = plain(status);
    *r.body_mut() = B::from(body);
    r.headers_mut().insert(CONTENT_TYPE, content_type);
    ready(r)
}

fn shadow_refusal<C: Clock>(
    s: &Shared<C>,
    request: &tokengate::scope::Request,
    v: &ScopeVerdict<'_>,
) {
    let Some(kind) = v.refused() else {
        return;
    };
    s.counts.shadow_rejected(kind, v.cost());
    // At DEBUG, like the decision records: counted either way.
    #[cfg(feature = "tracing")]
    tracing::debug!(
        target: "tokengate::shadow",
        limiter = %v.refused_scope(request).unwrap_or(Scope::Global),
        result = "shadow_rejected",
        retry_after_seconds = v.retry_after().map(retry_after_seconds),
        "shadow mode: refused, admitted anyway"
    );
    #[cfg(not(feature = "tracing"))]
    let _ = request;
}

/// The 429 for a refusal, with `Retry-After` and the refusing scope's fields.
fn refusal<B: From<Bytes>, C: Clock>(
    s: &Shared<C>,
    request: &tokengate::scope::Request,
    v: &ScopeVerdict<'_>,
    route: Option<RouteId>,
) -> Response<B> {
    let kind = v.refused().unwrap_or(ScopeKind::Global);
    let scope = v.refused_scope(request).unwrap_or(Scope::Global);
    let retry_after = v.retry_after().map(retry_after_seconds);
    let refused = Refused {
        scope,
        retry_after,
        cost: v.cost(),
        route,
    };
    let (content_type, body) = (s.refusal_body)(&refused);
    let mut r = plain(StatusCode::TOO_MANY_REQUESTS);
    *r.body_mut() = B::from(body);
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, content_type);
    if let Some(secs) = retry_after {
        h.insert(RETRY_AFTER, secs.into());
    }
    if let (Some(q), Some(dec), true) = (
        &s.quotas.by_kind[kind],
        v.decision(),
        v.tightest() == Some(kind),
    ) {
        let item = Item::new(kind, q, &dec, retry_after);
        Fields::new(&s.quotas, &[item], s.ietf, s.legacy).write(h);
    }
    r
}

/// Fills unused item slots (never read).
const FILLER: Item = Item {
    kind: ScopeKind::Global,
    quota: 0,
    remaining: 0,
    reset: 0,
};

/// The fields of an admission decided on a limiter with one scope kind that has a
/// quota (so that the scopes paid are at most one, the verdict's tightest): `None` when
/// it paid none.
fn admitted_alone<C: Clock>(s: &Shared<C>, v: &ScopeVerdict<'_>) -> Option<After<C>> {
    let kind = v.tightest()?;
    let (Some(q), Some(dec)) = (&s.quotas.by_kind[kind], v.decision()) else {
        return None;
    };
    let item = Item::new(kind, q, &dec, None);
    Some(After {
        fields: Fields::new(&s.quotas, &[item], s.ietf, s.legacy),
        refund: None,
    })
}

/// The fields (every scope's) and refund of an admission.
fn admitted<C: Clock>(
    shared: &Arc<Shared<C>>,
    d: &ScopeDecision<'_>,
    options: &Options,
) -> After<C> {
    let s = &**shared;
    let mut items: PerKind<Item> = [FILLER; ScopeKind::COUNT];
    let mut n = 0;
    for scope in d.scopes() {
        let kind = scope.kind();
        let (Some(q), Some(dec)) = (&s.quotas.by_kind[kind], d.decision(scope)) else {
            continue;
        };
        if s.admitted_fields {
            items[n] = Item::new(kind, q, &dec, None);
            n += 1;
        }
    }
    After {
        fields: Fields::new(&s.quotas, &items[..n], s.ietf, s.legacy),
        refund: options
            .refund
            .as_ref()
            .and_then(|r| d.charge().map(|c| (c, Arc::clone(r), Arc::clone(shared)))),
    }
}
