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
    ApiKeyId, Charge, RouteId, Scope, ScopeDecision, ScopeError, ScopeKind, TenantId, UserId,
};
use tokengate::{Clock, QuantaClock, ScopedLimiter};
use tower_service::Service;

use crate::key::{Head, KeyError};
use crate::layer::{Options, Shared};
use crate::response::{Fields, Item, MissingKey, Refused, retry_after_seconds};
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
        after: Option<After<C>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B, E> {
        Inner { #[pin] fut: F },
        Ready { response: Option<Response<B>> },
        Waiting { fut: BoxFuture<B, E> },
    }
}

impl<F, B, E, C: Clock> fmt::Debug for ResponseFuture<F, B, E, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// What an admitted request does to its response: rate-limit fields, refund on status.
struct After<C: Clock> {
    fields: Fields,
    refund: Option<(Charge, StatusPredicate, Arc<Shared<C>>)>,
}

impl<C: Clock> After<C> {
    fn apply<B>(self, response: &mut Response<B>) {
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

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            StateProj::Inner { fut } => {
                let mut response = ready!(fut.poll(cx))?;
                if let Some(after) = this.after.take() {
                    after.apply(&mut response);
                }
                Poll::Ready(Ok(response))
            }
            StateProj::Ready { response } => Poll::Ready(Ok(response
                .take()
                .expect("ResponseFuture polled after completion"))),
            StateProj::Waiting { fut } => fut.as_mut().poll(cx),
        }
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

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let s = &*self.shared;
        let (route, options) = match s
            .routes
            .iter()
            .find(|r| r.route.matches(req.method(), req.uri().path()))
        {
            Some(r) => (Some(r.id), &r.options),
            None => (None, &s.default),
        };
        let head = Head {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
            extensions: req.extensions(),
        };
        let mut request = tokengate::scope::Request::new();
        request.route = route;
        for kind in [ScopeKind::Tenant, ScopeKind::User, ScopeKind::ApiKey] {
            let Some(key) = &s.keys[kind as usize] else {
                continue;
            };
            let id = match key.extract(&head, &s.proxies, &s.hasher) {
                Ok(Some(id)) => id,
                Ok(None) if !key.is_required() => continue,
                Ok(None) => return missing(s, kind, KeyError::Absent),
                Err(e) => return missing(s, kind, e),
            };
            match kind {
                ScopeKind::Tenant => request.tenant = Some(TenantId(id)),
                ScopeKind::User => request.user = Some(UserId(id)),
                _ => request.api_key = Some(ApiKeyId(id)),
            }
        }
        let limiter = &s.limiter;
        let mut skip = [ScopeKind::Global; 6];
        let mut skipped = 0;
        let mut remote_skipped = false;
        let decision = loop {
            let d = if skipped == 0 {
                limiter.try_acquire(&request, options.class)
            } else {
                limiter.try_acquire_without(&request, options.class, &skip[..skipped])
            };
            let d = match d {
                Ok(d) => d,
                Err(ScopeError::RemoteUnavailable { retry_after }) => {
                    s.counts.store_unavailable();
                    // Served on the local scopes alone: paid again without the remote
                    // kinds (which then cannot be unavailable).
                    if s.store_down_admits && !remote_skipped {
                        remote_skipped = true;
                        for kind in limiter.remote_kinds() {
                            if !skip[..skipped].contains(&kind) {
                                skip[skipped] = kind;
                                skipped += 1;
                            }
                        }
                        continue;
                    }
                    return ready(store_unavailable(retry_after));
                }
                Err(_) => return ready(plain(StatusCode::INTERNAL_SERVER_ERROR)),
            };
            #[cfg(feature = "tracing")]
            d.trace();
            match d.refused_scope().map(|sc| sc.kind()) {
                Some(kind)
                    if s.shadow_kinds.contains(&kind) && !skip[..skipped].contains(&kind) =>
                {
                    shadow_refusal(s, &d);
                    skip[skipped] = kind;
                    skipped += 1;
                }
                _ => break d,
            }
        };
        if decision.is_rejected() {
            if options.shadow {
                shadow_refusal(s, &decision);
                return call_inner(&mut self.inner, req, None);
            }
            let within = decision
                .retry_after()
                .is_some_and(|w| !options.max_wait.is_zero() && w <= options.max_wait);
            if within {
                if let Ok(reservation) =
                    limiter.reserve_owned(&request, options.class, options.max_wait)
                {
                    let shared = Arc::clone(&self.shared);
                    let refund = options.refund.clone();
                    return wait(&mut self.inner, shared, req, reservation, refund);
                }
            }
            return ready(refusal(s, &decision, route));
        }
        let after = admitted(&self.shared, &decision, options);
        call_inner(&mut self.inner, req, Some(after))
    }
}

fn call_inner<S, C: Clock, ReqBody, ResBody>(
    inner: &mut S,
    req: Request<ReqBody>,
    after: Option<After<C>>,
) -> ResponseFuture<S::Future, ResBody, S::Error, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    ResponseFuture {
        state: State::Inner {
            fut: inner.call(req),
        },
        after,
    }
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
    ResponseFuture {
        state: State::Waiting { fut: Box::pin(fut) },
        after: None,
    }
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
    ResponseFuture {
        state: State::Ready {
            response: Some(response),
        },
        after: None,
    }
}

/// 503 with `Retry-After` ([`retry_after_seconds`]) and a problem-details
/// body: the limiter's remote store cannot decide now.
fn store_unavailable<B: From<Bytes>>(retry_after: Duration) -> Response<B> {
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

fn plain<B: From<Bytes>>(status: StatusCode) -> Response<B> {
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

fn shadow_refusal<C: Clock>(s: &Shared<C>, d: &ScopeDecision<'_>) {
    let Some(scope) = d.refused_scope() else {
        return;
    };
    s.counts.shadow_rejected(scope.kind());
    #[cfg(feature = "tracing")]
    tracing::info!(
        target: "tokengate::shadow",
        limiter = %scope,
        result = "shadow_rejected",
        retry_after_seconds = d.retry_after().map(retry_after_seconds),
        "shadow mode: refused, admitted anyway"
    );
}

/// The 429 for a refusal, with `Retry-After` and the refusing scope's fields.
fn refusal<B: From<Bytes>, C: Clock>(
    s: &Shared<C>,
    d: &ScopeDecision<'_>,
    route: Option<RouteId>,
) -> Response<B> {
    let scope = d.refused_scope().unwrap_or(Scope::Global);
    let kind = scope.kind();
    let retry_after = d.retry_after().map(retry_after_seconds);
    let refused = Refused {
        scope,
        retry_after,
        cost: d.cost(scope).unwrap_or(0),
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
    if let (Some(q), Some(dec)) = (&s.quotas.by_kind[kind as usize], d.decision(scope)) {
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

/// The fields and refund of an admission; counts admissions near the limit.
fn admitted<C: Clock>(
    shared: &Arc<Shared<C>>,
    d: &ScopeDecision<'_>,
    options: &Options,
) -> After<C> {
    let s = &**shared;
    let mut items = [FILLER; 6];
    let mut n = 0;
    for scope in d.scopes() {
        let kind = scope.kind();
        let (Some(q), Some(dec)) = (&s.quotas.by_kind[kind as usize], d.decision(scope)) else {
            continue;
        };
        if dec.tokens_remaining() * 10.0 < q.quota() as f64 {
            s.counts.near_limit(kind);
        }
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
