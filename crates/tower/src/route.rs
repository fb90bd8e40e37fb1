//! Routes: a method and a path pattern that pick the route scope, the work class (its
//! cost) and the per-route options (delay, refund on status, shadow).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};

pub(crate) type StatusPredicate = Arc<dyn Fn(StatusCode) -> bool + Send + Sync>;

/// A route: requests whose method and path match pay the route scope
/// (`route:{id}`, and `tenant:{t}:route:{id}` when a tenant is known) and cost the
/// route's work class.
///
/// Patterns are matched segment by segment: a literal segment matches itself, `{name}`
/// (or `:name`) matches any one segment, and a final `*` matches the rest (any number of
/// segments, including none). Routes are tried in the order they were added; the first
/// match wins. A `GET` route matches `HEAD` too (axum and hyper answer `HEAD` with the
/// `GET` handler), at the same cost and in the same route scope.
///
/// A request that matches no route (a 404 included) goes through the layer's
/// [fallback route](crate::RateLimitLayerBuilder::fallback): by default
/// [`Route::fallback`], no route scope, at the default class: unmatched paths pay the
/// global and per-key scopes like any other request, but no route budget shared by every
/// client.
///
/// ```
/// use std::time::Duration;
/// use tokengate_tower::Route;
/// let export = Route::post("/tenants/{tenant}/export")
///     .id(3)
///     .class("export")
///     .max_wait(Duration::from_secs(2)) // delay up to 2 s instead of refusing
///     .refund_on(|s| s.is_server_error()); // a failed export costs nothing
/// let anything_under_api = Route::any("/api/*").class("metadata");
/// # let _ = (export, anything_under_api);
/// ```
#[derive(Clone)]
pub struct Route {
    pub(crate) method: Option<Method>,
    pub(crate) pattern: Vec<Segment>,
    pub(crate) pattern_text: String,
    pub(crate) id: Option<u64>,
    pub(crate) options: RouteOptions,
}

/// What a route (or the layer's default for unmatched requests) sets.
#[derive(Clone, Default)]
pub(crate) struct RouteOptions {
    pub(crate) class: Option<String>,
    pub(crate) max_wait: Option<Duration>,
    pub(crate) refund: Option<StatusPredicate>,
    pub(crate) shadow: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Segment {
    Literal(String),
    Param,
    Rest,
}

impl fmt::Debug for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Route")
            .field("method", &self.method)
            .field("pattern", &self.pattern_text)
            .field("id", &self.id)
            .field("class", &self.options.class)
            .field("max_wait", &self.options.max_wait)
            .field("refund_on", &self.options.refund.as_ref().map(|_| "<fn>"))
            .field("shadow", &self.options.shadow)
            .finish()
    }
}

impl Route {
    /// Requests with `method` (any method for `None`) whose path matches `pattern`; a
    /// `GET` route matches `HEAD` requests too.
    pub fn new(method: Option<Method>, pattern: &str) -> Route {
        let pattern_text = pattern.to_owned();
        let segments: Vec<&str> = pattern.trim_start_matches('/').split('/').collect();
        let n = segments.len();
        let pattern = segments
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                if s == "*" && i + 1 == n {
                    Segment::Rest
                } else if (s.starts_with('{') && s.ends_with('}')) || s.starts_with(':') {
                    Segment::Param
                } else {
                    Segment::Literal(s.to_owned())
                }
            })
            .collect();
        Route {
            method,
            pattern,
            pattern_text,
            id: None,
            options: RouteOptions::default(),
        }
    }

    /// The default fallback route: any method, any path, no route scope until given an
    /// [`id`](Route::id) (see
    /// [`RateLimitLayerBuilder::fallback`](crate::RateLimitLayerBuilder::fallback)).
    pub fn fallback() -> Route {
        Route::any("/*")
    }

    /// `GET` (and `HEAD`) requests matching `pattern`.
    pub fn get(pattern: &str) -> Route {
        Route::new(Some(Method::GET), pattern)
    }

    /// `POST` requests matching `pattern`.
    pub fn post(pattern: &str) -> Route {
        Route::new(Some(Method::POST), pattern)
    }

    /// Requests of any method matching `pattern`.
    pub fn any(pattern: &str) -> Route {
        Route::new(None, pattern)
    }

    /// The route scope's id (`route:{id}`); by default the route's position in the
    /// layer's list, from 1 (the fallback route has none by default).
    pub fn id(mut self, id: u64) -> Route {
        self.id = Some(id);
        self
    }

    /// The work class (by name, one of the limiter's) a matching request costs; by
    /// default the layer's default class.
    pub fn class(mut self, name: &str) -> Route {
        self.options.class = Some(name.to_owned());
        self
    }

    /// Delay instead of refusing: a refused request waits (an owned reservation, in
    /// order) up to `max_wait`, then is served. Needs policies built with
    /// `max_reservation` at least as long.
    pub fn max_wait(mut self, max_wait: Duration) -> Route {
        self.options.max_wait = Some(max_wait);
        self
    }

    /// Gives the tokens back when the inner service answers with a status for which
    /// `refund` is true (exact refund of every scope paid).
    pub fn refund_on(
        mut self,
        refund: impl Fn(StatusCode) -> bool + Send + Sync + 'static,
    ) -> Route {
        self.options.refund = Some(Arc::new(refund));
        self
    }

    /// Shadow mode for this route: decide and count, but admit.
    pub fn shadow(mut self, on: bool) -> Route {
        self.options.shadow = Some(on);
        self
    }

    pub(crate) fn matches(&self, method: &Method, path: &str) -> bool {
        if let Some(m) = &self.method {
            // HEAD is GET without the body: the same handler, so the same route.
            if m != method && !(*m == Method::GET && *method == Method::HEAD) {
                return false;
            }
        }
        let mut parts = path.trim_start_matches('/').split('/');
        for seg in &self.pattern {
            match seg {
                Segment::Rest => return true,
                Segment::Param => {
                    if parts.next().is_none_or(str::is_empty) {
                        return false;
                    }
                }
                Segment::Literal(l) => {
                    if parts.next() != Some(l.as_str()) {
                        return false;
                    }
                }
            }
        }
        parts.next().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_literals_params_and_a_final_rest() {
        let r = Route::get("/t/{tenant}/search");
        assert!(r.matches(&Method::GET, "/t/42/search"));
        assert!(!r.matches(&Method::POST, "/t/42/search"));
        assert!(!r.matches(&Method::GET, "/t//search"));
        assert!(!r.matches(&Method::GET, "/t/42/search/more"));
        assert!(!r.matches(&Method::GET, "/t/42"));
        let rest = Route::any("/api/*");
        assert!(rest.matches(&Method::PUT, "/api/"));
        assert!(rest.matches(&Method::PUT, "/api/a/b"));
        assert!(!rest.matches(&Method::PUT, "/apix/a"));
        assert!(Route::get("/").matches(&Method::GET, "/"));
    }

    #[test]
    fn a_get_route_matches_head_and_no_other_route_does() {
        let r = Route::get("/search");
        assert!(r.matches(&Method::HEAD, "/search"));
        assert!(!r.matches(&Method::HEAD, "/other"));
        assert!(!Route::post("/search").matches(&Method::HEAD, "/search"));
        let head_only = Route::new(Some(Method::HEAD), "/x");
        assert!(!head_only.matches(&Method::GET, "/x"));
        let f = Route::fallback();
        for path in ["/", "/a", "/a/b/c", ""] {
            assert!(f.matches(&Method::DELETE, path), "{path}");
        }
    }
}
