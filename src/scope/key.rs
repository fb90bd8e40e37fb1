//! Typed scope keys: who shares a budget.

use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        ///
        /// A plain number: map your own identifiers (database ids, interned names) to it
        /// once, outside the hot path. `Display` prints the number.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

id_type!(
    /// A tenant (a customer organisation).
    TenantId
);
id_type!(
    /// A user.
    UserId
);
id_type!(
    /// An API key (its record's id, never the secret).
    ApiKeyId
);
id_type!(
    /// A route or endpoint.
    RouteId
);

/// The kinds of scope, in the fixed order a scoped limiter locks their maps in.
///
/// ```
/// use tokengate::scope::ScopeKind;
/// assert_eq!(ScopeKind::TenantRoute.to_string(), "tenant_route");
/// assert!(ScopeKind::Tenant < ScopeKind::User);
/// assert_eq!(ScopeKind::ALL.len(), 6);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScopeKind {
    /// One bucket for every request.
    Global,
    /// One bucket per tenant.
    Tenant,
    /// One bucket per user.
    User,
    /// One bucket per API key.
    ApiKey,
    /// One bucket per route.
    Route,
    /// One bucket per (tenant, route) pair.
    TenantRoute,
}

impl ScopeKind {
    /// Every kind, in order.
    pub const ALL: [ScopeKind; 6] = [
        ScopeKind::Global,
        ScopeKind::Tenant,
        ScopeKind::User,
        ScopeKind::ApiKey,
        ScopeKind::Route,
        ScopeKind::TenantRoute,
    ];

    /// Position in [`ScopeKind::ALL`].
    #[inline]
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The name used in scope keys and records.
    pub fn name(self) -> &'static str {
        match self {
            ScopeKind::Global => "global",
            ScopeKind::Tenant => "tenant",
            ScopeKind::User => "user",
            ScopeKind::ApiKey => "api_key",
            ScopeKind::Route => "route",
            ScopeKind::TenantRoute => "tenant_route",
        }
    }
}

impl fmt::Display for ScopeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One scope key: the budget a request pays into.
///
/// Typed, `Copy`, at most 24 bytes: building one on the hot path formats nothing and
/// allocates nothing. `Display` gives the textual form (`global`, `tenant:42`, `user:7`,
/// `api_key:9`, `route:3`, `tenant:42:route:3`), for logs and metric labels.
///
/// ```
/// use tokengate::{scope::RouteId, scope::Scope, scope::ScopeKind, scope::TenantId};
/// let scope = Scope::TenantRoute(TenantId(42), RouteId(3));
/// assert_eq!(scope.to_string(), "tenant:42:route:3");
/// assert_eq!(scope.kind(), ScopeKind::TenantRoute);
/// assert_eq!(Scope::Global.to_string(), "global");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// The global scope.
    Global,
    /// A tenant's scope.
    Tenant(TenantId),
    /// A user's scope.
    User(UserId),
    /// An API key's scope.
    ApiKey(ApiKeyId),
    /// A route's scope, across tenants.
    Route(RouteId),
    /// A route within one tenant.
    TenantRoute(TenantId, RouteId),
}

impl Scope {
    /// The kind of this scope.
    pub fn kind(&self) -> ScopeKind {
        match self {
            Scope::Global => ScopeKind::Global,
            Scope::Tenant(_) => ScopeKind::Tenant,
            Scope::User(_) => ScopeKind::User,
            Scope::ApiKey(_) => ScopeKind::ApiKey,
            Scope::Route(_) => ScopeKind::Route,
            Scope::TenantRoute(..) => ScopeKind::TenantRoute,
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Global => f.write_str("global"),
            Scope::Tenant(t) => write!(f, "tenant:{t}"),
            Scope::User(u) => write!(f, "user:{u}"),
            Scope::ApiKey(k) => write!(f, "api_key:{k}"),
            Scope::Route(r) => write!(f, "route:{r}"),
            Scope::TenantRoute(t, r) => write!(f, "tenant:{t}:route:{r}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_uses_the_seed_forms() {
        let cases = [
            (Scope::Global, "global"),
            (Scope::Tenant(TenantId(42)), "tenant:42"),
            (Scope::User(UserId(7)), "user:7"),
            (Scope::ApiKey(ApiKeyId(9)), "api_key:9"),
            (Scope::Route(RouteId(3)), "route:3"),
            (
                Scope::TenantRoute(TenantId(42), RouteId(3)),
                "tenant:42:route:3",
            ),
        ];
        for (scope, text) in cases {
            assert_eq!(scope.to_string(), text);
        }
        assert!(std::mem::size_of::<Scope>() <= 24);
    }
}
